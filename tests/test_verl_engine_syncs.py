"""A ledger line for every weight sync, whatever verl's checkpoint engine, with the bridge and the
weight_sync observer installed in process.

The engines other than ``naive`` need hardware here (nccl and nixl cupy, delta ZeroMQ and a GPU),
so each is a stand-in built on verl 0.9.1's real ``CheckpointEngine`` base, with the signatures of
its real methods: ``send_weights(weights, global_steps=None)`` for the full-sync engines
(``nccl_checkpoint_engine.py:315``), ``send_weights(engine, global_steps=None)`` and
``wire_format = "delta_flush"`` for the delta engine (``delta_checkpoint_engine.py:251,569``),
and the trainer worker's call into them (``engine_workers.py:757-765``).  verl's real trainer on
its separate_async mode, with this repository's CPU engine, is
tests/test_verl_cpu_checkpoint_engine.py.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

with warnings.catch_warnings():  # verl's engine module imports Ray's state API, which warns that it moved
    warnings.simplefilter("ignore", DeprecationWarning)
    from verl.checkpoint_engine.base import CheckpointEngine

import verl_events
from verl_events import Payload, unwatch_payloads, watch_payloads
from verl_events.apps.cli import main as verl_events_main
from verl_events.bus.weights import passing
from verl_events.observers.weight_sync import SyncRecord
from verl_events.verl_bridge import install_verl_bridge, uninstall_verl_bridge

from .verl_workers import ActorRolloutRefWorker, Rollout

pytestmark = pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")


class _StandIn(CheckpointEngine):  # type: ignore[misc]
    """What every engine must define besides the send and the receive; nothing here."""

    def __init__(self) -> None:
        self.wire: list[Any] = []

    def prepare(self) -> dict[str, Any]:
        return {}

    def finalize(self) -> None:
        pass

    @classmethod
    def build_topology(cls, *args: Any, **kwargs: Any) -> Any:
        return None

    def init_process_group(self, *args: Any, **kwargs: Any) -> None:
        pass


def _bridged_classes() -> tuple[type, type, type]:
    """The stand-ins and the worker, defined once the bridge is installed, as verl's engine modules
    and a custom ``custom_backend_module`` are imported after the plugin installed it."""

    class NcclLike(_StandIn):
        async def send_weights(self, weights: Any, global_steps: int | None = None) -> dict[str, float]:
            self.wire = [(name, tensor.detach().clone()) for name, tensor in weights]
            return {"checkpoint_engine/buckets": 1.0}

        async def receive_weights(self, global_steps: int | None = None) -> AsyncIterator[tuple[str, Any]]:
            for pair in self.wire:
                yield pair

    class DeltaLike(_StandIn):
        wire_format = "delta_flush"

        async def send_weights(self, engine: Any, global_steps: int | None = None) -> dict[str, float]:
            values = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
            spec = torch.tensor(list(b'{"n": 1}'), dtype=torch.uint8)
            self.wire = [([("__delta_spec__", spec), ("__values__", values)], True)]
            return {"checkpoint_engine/flushes": 1.0}

        def receive_weights(self, global_steps: int | None = None) -> Iterator[tuple[list[Any], bool]]:
            yield from self.wire

    class EngineWorker(ActorRolloutRefWorker):
        """verl's actor worker with a checkpoint engine: any mode but naive sends through it."""

        def __init__(self, checkpoint_engine: CheckpointEngine) -> None:
            super().__init__()
            self.checkpoint_engine = checkpoint_engine

        async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> Any:
            if isinstance(self.checkpoint_engine, DeltaLike):
                return await self.checkpoint_engine.send_weights(self.actor.engine, global_steps=global_steps)
            params = ((name, p) for name, p in self.actor.engine.module.state_dict().items())
            return await self.checkpoint_engine.send_weights(params, global_steps=global_steps)

    return NcclLike, DeltaLike, EngineWorker


@pytest.fixture
def bridged() -> Iterator[tuple[type, type, type]]:
    install_verl_bridge()
    try:
        yield _bridged_classes()
    finally:
        uninstall_verl_bridge()


def ledger(save_path: Path) -> list[SyncRecord]:
    return [SyncRecord.from_json(line) for line in (save_path / "weight_sync.jsonl").read_text().splitlines()]


RECEIPTS_ASKED: list[int] = []


def recorded_receipt(rank: int) -> dict[str, tuple[str, str]]:
    """A receipt engine that only says it was asked."""
    RECEIPTS_ASKED.append(rank)
    return {}


def train(worker: Any) -> None:
    with torch.no_grad():
        for parameter in worker.actor.engine.module.parameters():
            parameter.add_(0.01)


def test_a_full_sync_engine_sending_from_the_trainer_gives_a_line_per_sync_with_its_manifest(
    bridged: tuple[type, type, type], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nccl_like, _, engine_worker = bridged
    worker = engine_worker(nccl_like())
    receipt = f"{__name__}:recorded_receipt"
    config = {"save_path": str(tmp_path), "observers": [{"name": "weight_sync", "receipt_engine": receipt}]}
    RECEIPTS_ASKED.clear()
    with verl_events.install(config):
        for step in (0, 1, 2):
            asyncio.run(worker.update_weights(global_steps=step, mode="nccl"))
            train(worker)

    found = ledger(tmp_path)
    params = len(worker.actor.engine.module.state_dict())
    assert [(r.step, r.tensors, r.unchecked, r.complete) for r in found] == [(s, params, None, True) for s in (0, 1, 2)]
    assert {r.seen_at for r in found} == {"NcclLike.send_weights"}
    assert [r.changed for r in found] == [None, params, params]
    assert len(worker.checkpoint_engine.wire) == params  # the engine still got every pair
    # The receiver loads in its own process, maybe after the send returned: what the engine
    # holds at this point says nothing about the sync, so it is not asked.
    assert RECEIPTS_ASKED == [] and [r.receipt for r in found] == [None] * 3
    assert verl_events_main(["weights", str(tmp_path)]) == 0
    assert "unchecked" not in capsys.readouterr().out


def test_a_delta_engine_that_reads_the_weights_itself_gives_an_unchecked_line_per_sync_saying_why(
    bridged: tuple[type, type, type], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, delta_like, engine_worker = bridged
    worker = engine_worker(delta_like())
    config = {"save_path": str(tmp_path), "observers": [{"name": "weight_sync", "receipt_engine": None}]}
    with verl_events.install(config):
        for step in (0, 1):
            assert asyncio.run(worker.update_weights(global_steps=step, mode="delta_sharded")) == {
                "checkpoint_engine/flushes": 1.0
            }

    found = ledger(tmp_path)
    assert [(r.step, r.tensors, r.alarms) for r in found] == [(0, 0, []), (1, 0, [])]
    assert all(
        r.unchecked is not None and r.unchecked.startswith("DeltaLike.send_weights was handed a SimpleNamespace")
        for r in found
    ), found
    assert verl_events_main(["weights", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "2 sync(s) on 1 rank(s), steps 0-1; no alarms; 2 unchecked" in text
    assert "  step 0 rank 0, step 1 rank 0: DeltaLike.send_weights was handed a SimpleNamespace" in text


class _Watcher:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def began(self, payload: Payload) -> None:
        self.seen.append(f"began {payload.seen_at}")

    def tensor(self, name: str, tensor: Any) -> None:
        self.seen.append(name)

    def ended(self, payload: Payload, complete: bool) -> None:
        self.seen.append(f"ended {complete}")


def test_the_rollout_side_adapter_shows_named_tensors_and_hands_delta_flushes_on_unwatched(
    bridged: tuple[type, type, type],
) -> None:
    """verl's CheckpointEngineWorker.update_weights (base.py:354-360) hands the adapter what the
    engine receives, with the engine's wire format: a flush is a patch, not parameters."""
    nccl_like, delta_like, _ = bridged
    received: list[Any] = []

    class Adapter(Rollout):
        async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
            if wire_format == "delta_flush":
                received.extend(flush for flush in weights)
            else:
                received.extend([pair async for pair in weights])

    full, delta = nccl_like(), delta_like()
    full.wire = [("w", torch.ones(2)), ("b", torch.zeros(1))]
    delta.wire = [([("__values__", torch.ones(3))], True)]
    watcher = _Watcher()
    watch_payloads(watcher)
    try:
        for engine in (full, delta):
            weights = engine.receive_weights(global_steps=1)
            asyncio.run(Adapter().update_weights(weights, global_steps=1, wire_format=engine.wire_format))
    finally:
        unwatch_payloads(watcher)
    assert watcher.seen == ["began the rollout adapter's update_weights", "w", "b", "ended True"]
    assert [item[0] for item in received[:2]] == ["w", "b"] and received[2] == delta.wire[0]


def test_weights_that_are_iterable_both_ways_come_back_as_a_plain_generator() -> None:
    """An adapter that reads with a plain ``for`` must still be able to after the tap."""

    class Both:
        def __iter__(self) -> Iterator[tuple[str, Any]]:
            yield ("w", torch.ones(1))

        def __aiter__(self) -> AsyncIterator[tuple[str, Any]]:
            raise AssertionError("read as async")

    watcher = _Watcher()
    watch_payloads(watcher)
    try:
        assert [name for name, _ in passing(Both(), Payload(step=1, adapter=False))] == ["w"]
        untouched = SimpleNamespace()
        assert passing(untouched, Payload(step=1, adapter=False)) is untouched
    finally:
        unwatch_payloads(watcher)
    assert watcher.seen == ["began the rollout adapter's update_weights", "w", "ended True"]


@pytest.mark.parametrize("field", ["seen_at", "unchecked"])
def test_a_ledger_line_whose_seen_at_or_unchecked_is_not_text_is_skipped_with_a_warning(
    bridged: tuple[type, type, type], tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    """A run folder is untrusted: a reason that is a mapping must not reach the rendering."""
    _, delta_like, engine_worker = bridged
    worker = engine_worker(delta_like())
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "weight_sync"}]}):
        asyncio.run(worker.update_weights(global_steps=0, mode="delta_sharded"))
        asyncio.run(worker.update_weights(global_steps=1, mode="delta_sharded"))
    log = tmp_path / "weight_sync.jsonl"
    first, second = log.read_text().splitlines()
    hostile = json.loads(second) | {field: {"not": "text"}}
    log.write_text(f"{first}\n{json.dumps(hostile)}\n")
    assert verl_events_main(["weights", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "1 sync(s) on 1 rank(s), steps 0-0; no alarms; 1 unchecked" in out
    assert f"{log}:2: not a weight-sync record (its {field} is neither text nor null)" in err
