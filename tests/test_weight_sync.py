"""The weight_sync observer on real torch models, without verl (issue 27, part 2).

A sync here is what verl's trainer does, in one process: the trainer's weights pass the
payload tap (``verl_events.bus.weights.passing``, as the verl bridge puts it around a rollout
adapter's ``update_weights``) inside an ``update_weights`` stage, and an "engine" model loads
them.  The engine's receipt is taken from that model by :func:`engine_receipt`, the
``receipt_engine`` the observer is given.  Each fault really happens to a real tensor: an
engine that keeps a tensor's old value, a payload sent again after a real optimizer step, an
engine layer altered after loading, a NaN in the trainer's weights, a LoRA sync (real peft)
without its adapter.  verl's own trainer carries the same checks in
tests/test_verl_weight_sync.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import verl_events
from verl_events import ConfigError, stage
from verl_events.apps.cli import main as verl_events_main
from verl_events.bus.weights import Payload, passing, unwatch_payloads, watch_payloads
from verl_events.observers.weight_sync.fingerprint import fingerprint
from verl_events.observers.weight_sync.record import SyncRecord, weight_sync_log_path
from verl_events.testing import RecordingObserver

#: The engine each trainer rank syncs into, by rank (what request_receipt reaches on the CPU job).
ENGINES: dict[int, torch.nn.Module] = {}


def engine_receipt(rank: int) -> dict[str, tuple[str, str]]:
    return {
        name: (str(t.dtype).removeprefix("torch."), fingerprint(t)) for name, t in ENGINES[rank].state_dict().items()
    }


def failing_receipt(rank: int) -> dict[str, tuple[str, str]]:
    raise ConnectionError("the engine is gone")


def torch_spelled_receipt(rank: int) -> dict[str, tuple[Any, str]]:
    """As an engine may answer: ``str(t.dtype)`` (``torch.float32``), or the dtype itself."""
    held = ENGINES[rank].state_dict().items()
    return {name: (str(t.dtype) if "layers" in name else t.dtype, fingerprint(t)) for name, t in held}


def unknown_spelled_receipt(rank: int) -> dict[str, tuple[str, str]]:
    return {name: ("fp32", fingerprint(t)) for name, t in ENGINES[rank].state_dict().items()}


class Decoder(torch.nn.Module):
    """Three layers named as in a HF decoder (``model.layers.N...``)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(16, 8)
        self.model.layers = torch.nn.ModuleList(
            torch.nn.ModuleDict({"q_proj": torch.nn.Linear(8, 8), "up_proj": torch.nn.Linear(8, 8)}) for _ in range(3)
        )
        self.lm_head = torch.nn.Linear(8, 16, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            hidden = hidden + torch.tanh(layer["up_proj"](layer["q_proj"](hidden)))
        return self.lm_head(hidden)


def train_step(model: Decoder, optimizer: Any, step: int) -> None:
    with stage("actor_update", role="actor", step=step, model=model):
        ids = torch.arange(12).remainder(16).view(2, 6)
        loss = model(ids).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def sync(
    trainer: torch.nn.Module, step: int, *, weights: Any = None, after_loading: Callable[[], None] = lambda: None
) -> None:
    """Send ``weights`` (by default the trainer's full state dict) to ``ENGINES[0]``, as verl's
    naive sync does: one tensor at a time through the adapter, the engine loads them all, then
    ``after_loading`` runs, still inside the sync."""
    pairs = weights if weights is not None else ((n, t.detach().clone()) for n, t in trainer.state_dict().items())
    with stage("update_weights", role="actor", step=step):
        ENGINES[0].load_state_dict(dict(passing(pairs, Payload(step=step, adapter=False))))
        after_loading()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Path, RecordingObserver, Decoder, Any]]:
    torch.manual_seed(0)
    trainer = Decoder()
    ENGINES[0] = Decoder()
    listener = RecordingObserver()
    installed = verl_events.install(
        {
            "save_path": str(tmp_path),
            "observers": [{"name": "weight_sync", "receipt_engine": f"{__name__}:engine_receipt"}],
        },
        observers=[listener],
    )
    try:
        yield tmp_path, listener, trainer, torch.optim.SGD(trainer.parameters(), lr=0.1)
    finally:
        installed.close()
        ENGINES.clear()


def ledger(save_path: Path) -> list[SyncRecord]:
    return [SyncRecord.from_json(line) for line in weight_sync_log_path(save_path).read_text().splitlines()]


def weights_command(save_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    code = verl_events_main(["weights", str(save_path), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_fingerprints_are_equal_for_equal_bytes_and_differ_for_any_changed_word() -> None:
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 33, generator=generator)
    assert fingerprint(weight) == fingerprint(weight.clone())
    assert fingerprint(weight.t()) == fingerprint(weight.t().contiguous())  # the bytes in logical order
    for index in (0, 1000, weight.numel() - 1):
        changed = weight.clone()
        changed.view(-1)[index] = torch.nextafter(changed.view(-1)[index], torch.tensor(float("inf")))
        assert fingerprint(changed) != fingerprint(weight), index
    swapped = weight.clone()
    swapped.view(-1)[[0, 1]] = swapped.view(-1)[[1, 0]]
    assert fingerprint(swapped) != fingerprint(weight)  # position counts, not only the values
    assert fingerprint(weight.to(torch.bfloat16)) != fingerprint(weight)
    # Sizes that are not a multiple of 8 bytes: the trailing bytes count too.
    odd = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    odd_changed = odd.clone()
    odd_changed[2] = 4.0
    assert fingerprint(odd) == fingerprint(odd.clone()) != fingerprint(odd_changed)
    assert fingerprint(torch.zeros(3, dtype=torch.uint8)) != fingerprint(torch.zeros(4, dtype=torch.uint8))


def test_a_healthy_run_of_syncs_has_no_alarm_and_counts_what_changed(
    run: tuple[Path, RecordingObserver, Decoder, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    save_path, listener, trainer, optimizer = run
    sync(trainer, 0)
    for step in (1, 2):
        train_step(trainer, optimizer, step)
        sync(trainer, step)
    records = ledger(save_path)
    names = len(trainer.state_dict())
    assert [(r.step, r.tensors, r.changed, r.optimizer_stepped) for r in records] == [
        (0, names, None, False),
        (1, names, names, True),
        (2, names, names, True),
    ]
    assert all(r.alarms == [] and r.complete for r in records)
    assert all(r.receipt == {**r.receipt, "tensors": names, "compared": names, "same_dtype": True} for r in records)
    assert records[0].bytes == sum(t.numel() * t.element_size() for t in trainer.state_dict().values())
    assert listener.alerts == []
    code, out, _ = weights_command(save_path, capsys)
    assert code == 0
    assert "3 sync(s) on 1 rank(s), steps 0-2; no alarms" in out
    code, out, _ = weights_command(save_path, capsys, "--json")
    shown = json.loads(out)
    assert code == 0
    assert [(s["step"], s["changed"], s["optimizer_stepped"], s["alarms"]) for s in shown["syncs"]] == [
        (0, None, False, []),
        (1, names, True, []),
        (2, names, True, []),
    ]
    assert {"tensors", "receipt"} <= shown["syncs"][0].keys()


def _keep_old_value(trainer: Decoder, step: int) -> None:
    name = "model.layers.1.q_proj.weight"
    old = ENGINES[0].state_dict()[name].clone()

    def keep() -> None:
        with torch.no_grad():
            ENGINES[0].get_parameter(name).copy_(old)  # the engine silently kept it

    sync(trainer, step, after_loading=keep)


def _resend_previous(trainer: Decoder, step: int, previous: dict[str, Any]) -> None:
    sync(trainer, step, weights=iter(previous.items()))


def _alter_layer(trainer: Decoder, step: int) -> None:
    def alter() -> None:
        with torch.no_grad():
            for name, parameter in ENGINES[0].named_parameters():
                if name.startswith("model.layers.2."):
                    parameter.mul_(1.01)

    sync(trainer, step, after_loading=alter)


def _nan_in_payload(trainer: Decoder, step: int) -> None:
    with torch.no_grad():
        trainer.model.layers[0]["up_proj"].weight[0, 0] = float("nan")
    sync(trainer, step)


def _engine_without_a_tensor(trainer: Decoder, step: int) -> None:
    """An engine whose model names the output layer otherwise: the sent ``lm_head.weight``
    has nowhere to go."""
    engine = ENGINES[0]
    pairs = [(n, t.detach().clone()) for n, t in trainer.state_dict().items()]
    with stage("update_weights", role="actor", step=step):
        received = dict(passing(iter(pairs), Payload(step=step, adapter=False)))
        engine.output = engine.lm_head
        del engine.lm_head
        engine.load_state_dict(received, strict=False)


@pytest.mark.parametrize(
    ("fault", "kind", "tensor", "layer"),
    [
        ("keeps", "not_updated", "model.layers.1.q_proj.weight", "layer 1"),
        ("stale", "stale_payload", "model.embed_tokens.weight", None),
        ("altered", "differs", "model.layers.2.q_proj.weight", "layer 2"),
        ("nan", "nonfinite", "model.layers.0.up_proj.weight", "layer 0"),
        ("missing", "not_applied", "lm_head.weight", "lm_head"),
    ],
)
def test_each_fault_is_one_alarm_naming_the_tensor_and_layer_in_the_ledger_the_bus_and_diagnose(
    run: tuple[Path, RecordingObserver, Decoder, Any],
    capsys: pytest.CaptureFixture[str],
    fault: str,
    kind: str,
    tensor: str,
    layer: str | None,
) -> None:
    save_path, listener, trainer, optimizer = run
    sync(trainer, 0)
    train_step(trainer, optimizer, 1)
    sync(trainer, 1)
    previous = {n: t.detach().clone() for n, t in trainer.state_dict().items()}
    train_step(trainer, optimizer, 2)
    if fault == "keeps":
        _keep_old_value(trainer, 2)
    elif fault == "stale":
        _resend_previous(trainer, 2, previous)
    elif fault == "altered":
        _alter_layer(trainer, 2)
    elif fault == "nan":
        _nan_in_payload(trainer, 2)
    else:
        _engine_without_a_tensor(trainer, 2)
    records = ledger(save_path)
    assert [r.alarms for r in records[:2]] == [[], []]
    alarms = records[2].alarms
    assert [a.kind for a in alarms] == [kind], alarms
    assert alarms[0].tensors[0] == tensor
    assert alarms[0].layer == layer
    assert [(e.metric, e.step, e.stage, e.rank) for e in listener.alerts] == [
        (f"weight_sync/{kind}", 2, "update_weights", 0)
    ]
    where = f" ({layer})" if layer else ""
    code, out, _ = weights_command(save_path, capsys)
    assert code == 1
    assert f"step 2, rank 0: {kind}{where}:" in out
    # A whole-payload alarm (stale_payload) lists no tensors: the ledger has them.
    assert (tensor in out) is (layer is not None)
    code = verl_events_main(["diagnose", str(save_path)])
    out, _ = capsys.readouterr()
    assert code == 1
    assert f"weight sync alarm {kind}{where}:" in out


def test_a_lora_sync_without_adapter_tensors_is_named_and_with_them_is_not(tmp_path: Path) -> None:
    """A real peft model; what verl's adapter-mode sync sends is peft's adapter state dict
    (verl's collect_lora_params), which #7495 and verl-omni #608 found empty.  verl's CPU
    trainer is not run with LoRA here: the check is the observer's, on peft's real names."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = peft.get_peft_model(Decoder(), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    ENGINES[0] = Decoder()
    installed = verl_events.install(
        {"save_path": str(tmp_path), "observers": [{"name": "weight_sync", "receipt_engine": None}]}
    )
    try:
        adapter = peft.get_peft_model_state_dict(model)
        assert adapter and all("lora_" in name for name in adapter)
        with stage("update_weights", role="actor", step=1):
            list(passing(iter(adapter.items()), Payload(step=1, adapter=True)))
        base_only = {n: t for n, t in model.state_dict().items() if "lora_" not in n}
        with stage("update_weights", role="actor", step=2):
            list(passing(iter(base_only.items()), Payload(step=2, adapter=True)))
    finally:
        installed.close()
        ENGINES.clear()
    first, second = ledger(tmp_path)
    assert (first.adapter, first.adapter_tensors, first.alarms) == (True, len(adapter), [])
    assert first.receipt is None
    assert (second.adapter_tensors, [a.kind for a in second.alarms]) == (0, ["no_adapter"])


def test_a_tensor_left_out_of_a_sync_is_missing_and_a_healthy_sync_after_it_is_quiet(
    run: tuple[Path, RecordingObserver, Decoder, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The engine loads what it gets and keeps its old value of a tensor the sync left out:
    every tensor it got matches, so only the previous sync's names can tell."""
    save_path, listener, trainer, optimizer = run
    left = "model.layers.1.up_proj.weight"
    sync(trainer, 0)
    train_step(trainer, optimizer, 1)
    pairs = [(n, t.detach().clone()) for n, t in trainer.state_dict().items() if n != left]
    with stage("update_weights", role="actor", step=1):
        ENGINES[0].load_state_dict(dict(passing(iter(pairs), Payload(step=1, adapter=False))), strict=False)
    train_step(trainer, optimizer, 2)
    sync(trainer, 2)
    records = ledger(save_path)
    assert [[a.kind for a in r.alarms] for r in records] == [[], ["missing"], []]
    missing = records[1].alarms[0]
    assert (missing.tensors, missing.layer, records[1].tensors) == ([left], "layer 1", 13)
    assert records[1].receipt is not None and records[1].receipt["differs"] == []  # what it got matches
    code, out, _ = weights_command(save_path, capsys)
    assert code == 1 and "step 1, rank 0: missing (layer 1):" in out and left in out


def test_verls_first_lora_sync_sends_the_base_then_the_adapter_and_both_are_judged(tmp_path: Path) -> None:
    """verl 0.9.1's first LoRA sync (``base_sync_done=False``) sends the base weights, then the
    adapter, in one ``update_weights``; the later ones the adapter alone.  A NaN in the base
    weights is an alarm, and the later syncs, without the frozen base, are not ``missing`` it."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = peft.get_peft_model(Decoder(), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    base = {n: t.detach().clone() for n, t in model.state_dict().items() if "lora_" not in n}
    poisoned = next(n for n in base if n.endswith("up_proj.weight"))
    base[poisoned][0, 0] = float("nan")
    adapter = peft.get_peft_model_state_dict(model)
    installed = verl_events.install(
        {"save_path": str(tmp_path), "observers": [{"name": "weight_sync", "receipt_engine": None}]}
    )
    try:
        with stage("update_weights", role="actor", step=0):
            list(passing(iter(base.items()), Payload(step=0, adapter=False)))
            list(passing(iter(adapter.items()), Payload(step=0, adapter=True)))
        for step in (1, 2):
            with stage("update_weights", role="actor", step=step):
                list(passing(iter(adapter.items()), Payload(step=step, adapter=True)))
    finally:
        installed.close()
    first, *later = ledger(tmp_path)
    assert (first.payloads, first.tensors, first.adapter_tensors) == (2, len(base) + len(adapter), len(adapter))
    assert [(a.kind, a.tensors) for a in first.alarms] == [("nonfinite", [poisoned])]
    assert [(r.payloads, r.tensors, r.alarms) for r in later] == [(1, len(adapter), [])] * 2


def test_an_engine_that_gives_no_receipt_is_a_warning_and_the_syncs_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    trainer = Decoder()
    ENGINES[0] = Decoder()
    installed = verl_events.install(
        {
            "save_path": str(tmp_path),
            "observers": [{"name": "weight_sync", "receipt_engine": f"{__name__}:failing_receipt"}],
        }
    )
    try:
        with caplog.at_level(logging.WARNING, "verl_events.weight_sync"):
            sync(trainer, 0)
            sync(trainer, 1)
    finally:
        installed.close()
        ENGINES.clear()
    assert [(r.step, r.receipt, r.alarms) for r in ledger(tmp_path)] == [(0, None, []), (1, None, [])]
    warned = [r.getMessage() for r in caplog.records if "no receipt" in r.getMessage()]
    assert len(warned) == 1 and "ConnectionError: the engine is gone" in warned[0]


def test_dtypes_are_compared_by_meaning_and_a_receipt_in_an_unknown_spelling_is_refused_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An engine that spells float32 ``torch.float32`` holds the dtype that was sent: its bytes
    are compared, and a layer it altered is an alarm.  A spelling that names no dtype would make
    every tensor "another dtype", whose bytes are never compared: that receipt is refused."""
    torch.manual_seed(0)
    trainer = Decoder()
    for engine, save_path in (
        ("torch_spelled_receipt", tmp_path / "torch"),
        ("unknown_spelled_receipt", tmp_path / "x"),
    ):
        ENGINES[0] = Decoder()
        options = {"name": "weight_sync", "receipt_engine": f"{__name__}:{engine}"}
        installed = verl_events.install({"save_path": str(save_path), "observers": [options]})
        try:
            with caplog.at_level(logging.WARNING, "verl_events.weight_sync"):
                sync(trainer, 0)
                _alter_layer(trainer, 1)
        finally:
            installed.close()
            ENGINES.clear()
        records = ledger(save_path)
        if engine == "torch_spelled_receipt":
            assert [r.receipt["compared"] if r.receipt else None for r in records] == [14, 14]
            assert [[a.kind for a in r.alarms] for r in records] == [[], ["differs"]]
            assert records[1].alarms[0].layer == "layer 2"
        else:
            assert [(r.receipt, r.alarms) for r in records] == [(None, []), (None, [])]
            refused = [r.getMessage() for r in caplog.records if "names no torch dtype" in r.getMessage()]
            assert len(refused) == 2 and "'fp32'" in refused[0], refused


def test_the_tap_hands_every_pair_on_unchanged_and_a_failing_watcher_never_stops_the_sync() -> None:
    pairs = [("a", torch.ones(2)), ("b", torch.zeros(3))]
    assert passing(pairs, Payload(1, False)) is pairs  # no watcher: the sender's own iterable

    class Broken:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def began(self, payload: Payload) -> None: ...

        def tensor(self, name: str, tensor: Any) -> None:
            self.seen.append(name)
            raise RuntimeError("a watcher's bug")

        def ended(self, payload: Payload, complete: bool) -> None:
            raise AssertionError("a dropped watcher is not called again")

    class Counting:
        def __init__(self) -> None:
            self.seen: list[str] = []
            self.complete: bool | None = None

        def began(self, payload: Payload) -> None: ...

        def tensor(self, name: str, tensor: Any) -> None:
            self.seen.append(name)

        def ended(self, payload: Payload, complete: bool) -> None:
            self.complete = complete

    broken, counting = Broken(), Counting()
    watch_payloads(broken)
    watch_payloads(counting)
    try:
        assert list(passing(iter(pairs), Payload(1, False))) == pairs
        assert (broken.seen, counting.seen, counting.complete) == (["a"], ["a", "b"], True)

        async def pairs_async() -> Any:
            for pair in pairs:
                yield pair

        async def drain() -> list[Any]:
            return [pair async for pair in passing(pairs_async(), Payload(2, False))]

        counting.seen = []
        assert asyncio.run(drain()) == pairs
        assert counting.seen == ["a", "b"]
        stopped = passing(iter(pairs), Payload(3, False))
        next(stopped)
        stopped.close()  # the sender stopped after the first tensor
        assert counting.complete is False
    finally:
        unwatch_payloads(broken)
        unwatch_payloads(counting)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"receipt_engine": "my engine.py"}, "option receipt_engine: 'my engine.py' is not allowed"),
        ({"receipt_engine": 3}, "option receipt_engine: 3 is not allowed; use a string or null"),
        ({"canary": True}, "option canary: true needs option canary_engine"),
    ],
)
def test_bad_options_are_refused_by_name(tmp_path: Path, options: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "weight_sync", **options}]})


def test_weights_says_what_is_wrong_with_its_input(
    run: tuple[Path, RecordingObserver, Decoder, Any],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    save_path, _, trainer, optimizer = run
    empty = tmp_path_factory.mktemp("empty")
    code, _, err = weights_command(empty, capsys)
    assert code == 2
    assert "has no weight_sync.jsonl and no timing log says which observers were on: no weight_sync observer" in err
    code, _, err = weights_command(empty / "nowhere", capsys)
    assert (code, "does not exist; pass the save_path of a run" in err) == (2, True)

    sync(trainer, 0)
    train_step(trainer, optimizer, 1)
    sync(trainer, 1)
    log = weight_sync_log_path(save_path)
    whole = log.read_text()
    log.write_text(whole + whole.splitlines()[-1][:40])  # a line cut short by a process that died writing it
    code, out, err = weights_command(save_path, capsys)
    assert code == 0
    assert "2 sync(s)" in out
    assert f"{log}:3: not a JSON line (" in err

    other = tmp_path_factory.mktemp("other")
    (other / "run.json").write_text(json.dumps({"run_id": "run-another"}))
    (other / log.name).write_text(whole)
    code, _, err = weights_command(other, capsys)
    assert code == 2
    assert "holds no sync of run run-another: every line was skipped (" in err and "belongs to run 'run-" in err


def engine_canary(rank: int, ids: list[list[int]]) -> Any:
    from verl_events.observers.weight_sync.canary import forward

    return forward(ENGINES[rank], ids)


def tiny_qwen2() -> Any:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


def canary_run(save_path: Path, receipt: bool, faults: dict[int, Callable[[], None]]) -> list[SyncRecord]:
    """Syncs 0-3 of a real (tiny) Qwen2, with a real AdamW step before each after the first;
    ``faults[step]`` runs on the engine after it loaded that sync."""
    torch.manual_seed(0)
    trainer = tiny_qwen2()
    ENGINES[0] = tiny_qwen2()
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=1e-4)
    receipt_engine = f"{__name__}:engine_receipt" if receipt else None
    options = {"receipt_engine": receipt_engine, "canary": True, "canary_engine": f"{__name__}:engine_canary"}
    installed = verl_events.install({"save_path": str(save_path), "observers": [{"name": "weight_sync", **options}]})
    try:
        for step in range(4):
            if step:
                ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(step))
                with stage("actor_update", role="actor", step=step, model=trainer):
                    loss = trainer(input_ids=ids, labels=ids).loss
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            pairs = ((n, t.detach().clone()) for n, t in trainer.state_dict().items())
            with stage("update_weights", role="actor", step=step, model=trainer):
                ENGINES[0].load_state_dict(dict(passing(pairs, Payload(step=step, adapter=False))))
                faults.get(step, lambda: None)()
    finally:
        installed.close()
        ENGINES.clear()
    return ledger(save_path)


def _scale_engine_layer(layer: int) -> Callable[[], None]:
    def scale() -> None:
        with torch.no_grad():
            for name, parameter in ENGINES[0].named_parameters():
                if name.startswith(f"model.layers.{layer}."):
                    parameter.mul_(1.01)

    return scale


def test_the_canary_is_quiet_on_healthy_syncs_and_names_the_layer_an_engine_fault_enters(tmp_path: Path) -> None:
    healthy, faulty = (
        canary_run(tmp_path / "healthy", True, {}),
        canary_run(tmp_path / "faulty", True, {2: _scale_engine_layer(1)}),
    )
    assert [r.alarms for r in healthy] == [[], [], [], []]
    assert [r.canary and r.canary["tolerance"] for r in healthy] == [None, 1e-3, 1e-3, 1e-3]
    assert all(r.canary and r.canary["max"] <= 1e-3 for r in healthy)
    kinds = [[(a.kind, a.layer) for a in r.alarms] for r in faulty]
    assert kinds == [[], [], [("differs", "layer 1"), ("canary", "layer 1")], []]
    check = faulty[2].canary
    assert check is not None and check["first_layer"] == "layer 1"
    assert check["layers"][0] <= 1e-3 < check["layers"][1]  # layer 0 untouched, layer 1 off


def test_without_names_to_compare_the_canary_alone_finds_the_fault(tmp_path: Path) -> None:
    """An engine whose weights cannot be compared by name (vLLM fuses q, k and v): no receipt,
    and the canary still names the layer."""
    records = canary_run(tmp_path, False, {3: _scale_engine_layer(2)})
    assert [r.receipt for r in records] == [None] * 4
    assert [[(a.kind, a.layer) for a in r.alarms] for r in records] == [[], [], [], [("canary", "layer 2")]]


def test_the_canary_refuses_a_ranks_selection_and_a_bad_tolerance(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"must select every rank, not ranks \[0\]; drop its ranks"):
        verl_events.install(
            {
                "save_path": str(tmp_path),
                "observers": [
                    {"name": "weight_sync", "canary": True, "canary_engine": f"{__name__}:engine_canary", "ranks": [0]}
                ],
            }
        )
    with pytest.raises(ConfigError, match="option canary_tolerance: 0 is not allowed; use a number of nats > 0"):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "weight_sync", "canary_tolerance": 0}]})


def failing_canary(rank: int, ids: list[list[int]]) -> Any:
    raise ConnectionError("the engine is gone")


def test_after_the_engine_side_fails_the_trainers_forward_still_runs_at_every_sync(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Under FSDP the trainer's forward is collective: a rank whose engine side failed must
    still run it with its peers, or they would wait for it for ever."""
    torch.manual_seed(0)
    trainer = tiny_qwen2()
    forwards = []
    trainer.register_forward_pre_hook(lambda module, args: forwards.append(1))
    options = {"receipt_engine": None, "canary": True, "canary_engine": f"{__name__}:failing_canary"}
    installed = verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "weight_sync", **options}]})
    try:
        with caplog.at_level(logging.WARNING, "verl_events.weight_sync"):
            for step in range(3):
                pairs = ((n, t.detach().clone()) for n, t in trainer.state_dict().items())
                with stage("update_weights", role="actor", step=step, model=trainer):
                    list(passing(pairs, Payload(step=step, adapter=False)))
    finally:
        installed.close()
    assert len(forwards) == 3
    assert [(r.canary, r.alarms) for r in ledger(tmp_path)] == [(None, [])] * 3
    warned = [r.getMessage() for r in caplog.records if "engine side failed" in r.getMessage()]
    assert len(warned) == 1 and "ConnectionError: the engine is gone" in warned[0]


@pytest.mark.parametrize(
    ("observers", "code", "says"),
    [
        (
            [{"name": "timing"}, {"name": "weight_sync"}],
            0,
            "the weight_sync observer was on (it received 4 stage(s), by the timing logs) and no update_weights "
            "stage reached it: no weight sync ran where it watched",
        ),
        (
            [{"name": "timing"}, {"name": "weight_sync", "stages": ["actor_update"]}],
            1,
            "but 1 update_weights stage(s) ran where it did not watch (rank 0 step 3): nothing of those syncs was "
            "checked; widen its selection",
        ),
        ([{"name": "timing"}], 2, "no stage of its 1 timing log(s) reached a weight_sync observer"),
    ],
    ids=["on-no-sync", "syncs-unwatched", "not-on"],
)
def test_weights_tells_an_observer_that_saw_no_sync_from_one_that_was_not_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], observers: list[dict[str, Any]], code: int, says: str
) -> None:
    torch.manual_seed(0)
    trainer, ENGINES[0] = Decoder(), Decoder()
    optimizer = torch.optim.SGD(trainer.parameters(), lr=0.1)
    try:
        with verl_events.install({"save_path": str(tmp_path), "observers": observers}):
            for step in (1, 2, 3):
                train_step(trainer, optimizer, step)
            if code == 1:  # a real sync, on a stage the observer's selection leaves out
                sync(trainer, 3)
            else:
                train_step(trainer, optimizer, 4)
    finally:
        ENGINES.clear()
    assert not weight_sync_log_path(tmp_path).exists()
    found, out, err = weights_command(tmp_path, capsys)
    assert found == code and says in (err if code == 2 else out), (out, err)


def test_diagnose_of_a_run_whose_only_observer_saw_no_sync_says_it_ran_and_wrote_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = Decoder()
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "weight_sync"}]}):
        train_step(trainer, torch.optim.SGD(trainer.parameters(), lr=0.1), 1)
    assert verl_events_main(["diagnose", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "run.json and nothing else: its observers received stages here and wrote nothing" in err, err
    assert "a weight_sync observer that saw no sync" in err
