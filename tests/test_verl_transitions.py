"""verl's transitions as stages (verl_events/_verl_transitions.py): the weight sync, the rollout's
wake-up inside it, checkpoint save and load on verl-shaped workers built on verl 0.9.1's real
classes (tests/verl_workers.py), and a rank stuck in the sync named by ``verl-events hangs`` (two
gloo ranks).  The same stages on verl's real trainer: tests/test_verl_trainer.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("verl")

from verl_events import StageEnd
from verl_events.apps.cli import main as verl_events_main
from verl_events.testing import capture_events
from verl_events.verl_bridge import install_verl_bridge, uninstall_verl_bridge

from .support import run_two_gloo_ranks
from .verl_workers import ActorRolloutRefWorker, BaseRollout, Rollout, TrainingWorker, batch

pytestmark = pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")


@pytest.fixture
def bridge() -> Iterator[None]:
    """The bridge, installed for one test (tests/test_verl_bridge.py's, with the transitions)."""
    install_verl_bridge()
    try:
        yield
    finally:
        uninstall_verl_bridge()


def test_the_sync_its_wake_ups_and_the_checkpoints_are_stages_with_their_steps(bridge: None, tmp_path: Path) -> None:
    actor = ActorRolloutRefWorker()
    with capture_events() as events:
        asyncio.run(actor.update_weights(global_steps=0))  # the trainer, before step 1
        for step in (1, 2):
            actor.update_actor(batch(seed=step))
            actor.save_checkpoint(str(tmp_path / f"global_step_{step}/actor"), global_step=step)
            asyncio.run(actor.update_weights(global_steps=step, mode="naive"))
        actor.load_checkpoint(str(tmp_path / "global_step_1/actor"))
    begun = [(e.stage, e.step, e.depth, e.parent) for e in events if not isinstance(e, StageEnd)]
    assert begun == [
        ("update_weights", 0, 0, None),
        ("rollout_wake_up", 0, 1, "update_weights"),
        ("rollout_wake_up", 0, 1, "update_weights"),
        *(
            entry
            for step in (1, 2)
            for entry in (
                ("actor_update", step, 0, None),
                ("save_checkpoint", step, 0, None),  # the inner worker's save is the same stage
                ("update_weights", step, 0, None),
                ("rollout_wake_up", step, 1, "update_weights"),
                ("rollout_wake_up", step, 1, "update_weights"),
            )
        ),
        ("load_checkpoint", 1, 0, None),  # the step in the checkpoint's path
    ]
    wake_ups = [e for e in events if e.stage == "rollout_wake_up" and not isinstance(e, StageEnd)]
    assert [e.meta["tags"] for e in wake_ups[:2]] == [["weights"], ["kv_cache"]]
    assert {e.role for e in wake_ups} == {"rollout"}
    assert {e.role for e in events if e.stage == "update_weights"} == {"actor"}
    # The methods did their work, once per call.
    assert actor.calls["save_checkpoint"] == 2 and actor.calls["load_checkpoint"] == 1
    assert actor.rollout.resumed == [["weights"], ["kv_cache"]] * 3 and actor.rollout.synced


def test_a_failed_sync_is_a_stage_that_raised_and_leaves_the_step_as_it_was(bridge: None) -> None:
    actor = ActorRolloutRefWorker()

    async def broken(tags: list[str]) -> None:
        raise ConnectionError("the engine went away")

    asyncio.run(actor.update_weights(global_steps=1))
    actor.rollout.resume = broken  # type: ignore[method-assign]
    with capture_events() as events, pytest.raises(ConnectionError, match="went away"):
        asyncio.run(actor.update_weights(global_steps=2))
    ends = [e for e in events if isinstance(e, StageEnd)]
    assert [(e.stage, e.step, type(e.error).__name__) for e in ends] == [("update_weights", 2, "ConnectionError")]
    with capture_events() as events:
        actor.update_actor(batch())
    assert [e.step for e in events] == [2, 2]  # still the step after sync 1


def test_a_rollout_adapter_defined_after_install_wakes_up_as_a_stage(bridge: None) -> None:
    """verl imports vLLM's or SGLang's adapter only when a worker builds its rollout."""

    class LateRollout(Rollout):
        async def resume(self, tags: list[str]) -> None:
            self.resumed.append(["late", *tags])

    rollout = LateRollout()
    with capture_events() as events:
        asyncio.run(rollout.resume(tags=["weights"]))
    assert [(e.stage, e.meta["tags"]) for e in events] == [("rollout_wake_up", ["weights"])] * 2  # begin, end
    assert rollout.resumed == [["late", "weights"]]


def test_uninstall_puts_verls_transition_methods_back() -> None:
    def attributes() -> list[dict[str, Any]]:
        classes = (BaseRollout, Rollout, ActorRolloutRefWorker, TrainingWorker)
        return [dict(vars(cls)) for cls in classes]

    before = attributes()
    install_verl_bridge()
    assert vars(Rollout)["resume"] is not before[1]["resume"]
    assert vars(TrainingWorker)["save_checkpoint"] is not before[3]["save_checkpoint"]
    uninstall_verl_bridge()
    assert attributes() == before


@pytest.mark.slow
def test_a_rank_stuck_in_the_weight_sync_is_named_by_verl_events_hangs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two gloo ranks run the bridged sync step after step; at step 2 rank 1 is stuck at the
    sync's start (tests/support.py's Sleeper), so rank 0 waits in the sync's barrier.  While they
    hang, ``verl-events hangs`` names the stage, the step and rank 1; then the test ends both ranks."""
    save_path = tmp_path / "profile"
    config = {
        "save_path": str(save_path),
        "observers": [
            {"name": "watchdog", "timeout_s": 2, "stages": ["update_weights"]},
            {
                "_target_": "tests.support:Sleeper",
                "step": 2,
                "seconds": 600,
                "ranks": [1],
                "stages": ["update_weights"],
            },
        ],
    }
    (tmp_path / "observers.yaml").write_text(json.dumps(config))
    body = f"""
        import asyncio
        import verl_events
        from verl_events.verl_bridge import install_verl_bridge
        from tests.verl_workers import ActorRolloutRefWorker
        install_verl_bridge()
        with verl_events.install({str(tmp_path / "observers.yaml")!r}):
            worker = ActorRolloutRefWorker(rank=rank)
            for step in (0, 1, 2, 3):
                asyncio.run(worker.update_weights(global_steps=step, mode="naive"))
    """
    ranks = threading.Thread(target=run_two_gloo_ranks, args=(tmp_path, body, 600), daemon=True)
    ranks.start()
    try:
        hung = _wait_for_hang_records(save_path / "hangs.jsonl", step=2, ranks={0, 1}, ranks_thread=ranks)
        assert verl_events_main(["hangs", str(save_path), "--json"]) == 1
        found = json.loads(capsys.readouterr().out)
    finally:
        for beat in (save_path / "heartbeats").glob("rank*.json"):  # the ranks this test started
            with contextlib.suppress(ProcessLookupError, ValueError, KeyError):
                os.kill(json.loads(beat.read_text())["pid"], signal.SIGKILL)
        ranks.join(timeout=60)
    assert {(h["stage"], h["rank"]) for h in hung} == {("update_weights", 0), ("update_weights", 1)}
    assert found["stuck"] == {"step": 2, "stage": "update_weights"}, found
    positions = {r["rank"]: r for r in found["ranks"]}
    assert {r: (p["state"], p["stage"], p["step"]) for r, p in positions.items()} == {
        0: ("inside", "update_weights", 2),
        1: ("inside", "update_weights", 2),
    }, found
    assert "time.sleep" in positions[1]["where"]["code"], positions[1]
    print(found["suspect"]["line"])


def _wait_for_hang_records(
    log: Path, *, step: int, ranks: set[int], ranks_thread: threading.Thread
) -> list[dict[str, Any]]:
    """The hang records of ``step`` once every one of ``ranks`` has one (the watchdog writes them
    when the deadline passes); fails if the ranks' process ends first."""
    while ranks_thread.is_alive():
        records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        found = [r for r in records if r["step"] == step and r["kind"] == "hang"]
        if {r["rank"] for r in found} >= ranks:
            return found
        time.sleep(0.2)
    raise AssertionError(f"the ranks ended before both passed step {step}'s deadline: {log}")
