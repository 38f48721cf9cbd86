"""The memory observer's forecast (issue 28, part 3): a warning when a step's tokens
predict more memory than is left, given before the stage that would run out begins.

The host test makes the failure real: a rank whose address space is limited with
RLIMIT_AS runs a stage whose allocation grows with the step's tokens, until torch's CPU
allocator cannot have it.  The device test runs against the stand-in device module of
tests/test_memory.py (no CUDA here), which is checked there against torch.cuda's own
signatures.  The healthy runs vary their tokens up and down and must never warn.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import verl_events
from verl_events import AnomalyEvent, ConfigError, anomaly, stage
from verl_events.apps.cli import main as verl_events_main
from verl_events.observers.batch import TokenCounts, token_counts
from verl_events.observers.memory.forecast import Forecaster
from verl_events.observers.memory.host import read_status
from verl_events.observers.memory.record import MemoryRecord, memory_log_path

from .memory_support import MB, StandInCuda
from .support import REPO

pytestmark = pytest.mark.skipif(read_status() is None, reason="needs Linux /proc/self/status")


def records(save_path: Path, rank: int = 0) -> list[MemoryRecord]:
    return [MemoryRecord.from_json(line) for line in memory_log_path(save_path, rank).read_text().splitlines()]


def batch(tokens: int) -> dict[str, Any]:
    """A padded batch of 8 sequences holding ``tokens`` tokens in all (a multiple of 8)."""
    mask = torch.zeros(8, tokens // 8 + 4, dtype=torch.long)
    mask[:, : tokens // 8] = 1
    return {"attention_mask": mask}


def test_token_counts_read_verls_layouts() -> None:
    assert token_counts(batch(96)) == TokenCounts(sequences=8, tokens=96, padded_tokens=8 * 16)
    nested = torch.nested.nested_tensor([torch.arange(5), torch.arange(7)], layout=torch.jagged)
    assert token_counts({"input_ids": nested}) == token_counts({"input_ids": nested})
    found = token_counts({"input_ids": nested})
    assert (found.sequences, found.tokens, found.padded_tokens) == (2, 12, None)  # type: ignore[union-attr]
    assert token_counts({"responses": torch.ones(2, 3)}) is None
    assert token_counts(3.0) is None


def test_what_is_left_is_read_again_only_when_the_expectation_comes_near_it_or_the_read_is_old(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading what is left (a cgroup's files, /proc/meminfo) is most of a stage's forecast cost:
    it is read again only within half of the last figure, or a second after it."""
    from verl_events.observers.memory import forecast as forecast_module

    step = forecast_module.StepForecast()
    for tokens, grew in ((100, 10_000), (100, 1_000), (200, 2_000)):  # the first is warm-up
        step.learn("actor_update", 0, tokens, {"host": grew})
    step.step_tokens("actor_update", 7, 0, {"attention_mask": torch.ones(1, 200)}, None)
    reads: list[int] = []
    left = {"bytes": 10_000}

    def host_room() -> forecast_module.Headroom:
        reads.append(left["bytes"])
        return forecast_module.Headroom(left["bytes"], "MemAvailable")

    clock = [1000.0]
    monkeypatch.setattr(forecast_module.time, "monotonic", lambda: clock[0])
    assert step.check("actor_update", 7, 0, host_room, lambda: None) == [] and reads == [10_000]
    clock[0] += 0.5  # 2,000 expected, under half of the 10,000 left half a second ago: not read
    assert step.check("actor_update", 7, 0, host_room, lambda: None) == [] and reads == [10_000]
    clock[0] += 0.6  # past a second: read again, and what is left fell below the expectation
    left["bytes"] = 1_500
    (warning,) = step.check("actor_update", 7, 0, host_room, lambda: None)
    assert reads == [10_000, 1_500] and warning.headroom.bytes == 1_500
    clock[0] += 0.1  # 2,000 is past half of the 1,500 just read: read at every stage now
    step.check("actor_update", 7, 0, host_room, lambda: None)
    assert reads == [10_000, 1_500, 1_500]


def test_the_line_leaves_out_warm_up_and_never_expects_less_than_was_seen() -> None:
    forecaster = Forecaster()
    forecaster.learn(0, "actor_update", 100, {"host": 10_000})  # warm-up: left out
    forecaster.learn(0, "actor_update", 100, {"host": 1_000})
    assert forecaster.expect(0, "actor_update", "host", 300) is None  # one token count: no line yet
    forecaster.learn(0, "actor_update", 200, {"host": 2_000})
    assert forecaster.expect(0, "actor_update", "host", 300) == (3_000, 200, 2_000)
    assert forecaster.expect(1, "actor_update", "host", 300) is None  # another rank learns its own
    forecaster.learn(0, "actor_update", 300, {"host": 1_500})  # a falling line
    expected, _, _ = forecaster.expect(0, "actor_update", "host", 400)  # type: ignore[misc]
    assert expected >= 2_000


FORECAST_RANK = """\
import resource, sys
sys.path.insert(0, {repo!r})
import torch
import verl_events

MB = 1 << 20


def batch(tokens):  # as the test's own
    mask = torch.zeros(8, tokens // 8 + 4, dtype=torch.long)
    mask[:, : tokens // 8] = 1
    return {{"attention_mask": mask}}


config = {{"save_path": {save_path!r}, "observers": [{{"name": "watchdog"}}, {{"name": "memory"}}]}}
warned = []
verl_events.anomaly.connect(lambda sender, event: warned.append((event.step, sender)), weak=False)
with verl_events.install(config):
    for step, tokens in enumerate({schedule!r}, start=1):
        with verl_events.stage("rollout_generate", role="rollout", step=step, rank=0, inputs=batch(tokens)):
            pass
        if step == 2:
            # From here on, what the process has and {headroom_mb} MiB more.
            size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (size + {headroom_mb} * MB, resource.RLIM_INFINITY))
        with verl_events.stage("actor_update", role="actor", step=step, rank=0):
            print("warned before step", step, "allocated:", warned, flush=True)
            held = torch.ones(tokens * {mb_per_token} * MB // 4)  # touched: resident
            del held
"""


@pytest.mark.slow
def test_the_forecast_warns_before_the_step_whose_tokens_run_a_limited_rank_out_of_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Steps of 32, 48, 64, 80 and 200 tokens at 4 MiB a token, in 640 MiB of address space:
    the fifth step's 800 MiB cannot be had.  Its warning comes when its actor_update begins,
    before the allocation; none comes before."""
    script = tmp_path / "rank.py"
    script.write_text(
        FORECAST_RANK.format(
            repo=str(REPO),
            save_path=str(tmp_path / "run"),
            schedule=[32, 48, 64, 80, 200],
            headroom_mb=640,
            mb_per_token=4,
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "DefaultCPUAllocator: can't allocate memory" in done.stderr
    # The anomaly was sent before the allocation of step 5, and not before any other.
    assert "warned before step 4 allocated: []" in done.stdout
    assert "warned before step 5 allocated: [(5, 'actor_update')]" in done.stdout
    updates = [r for r in records(tmp_path / "run") if r.stage == "actor_update"]
    assert [r.step for r in updates] == [1, 2, 3, 4, 5]
    assert [r.tokens for r in updates] == [32, 48, 64, 80, 200]
    assert [r.forecast is not None for r in updates] == [False, False, False, False, True]
    [warning] = updates[-1].forecast  # type: ignore[misc]
    assert (warning["kind"], warning["limit"], warning["tokens"]) == ("host", "RLIMIT_AS", 200)
    # The line through steps 2 to 4 (192 to 320 MiB) gives about 800 MiB at 200 tokens.
    assert 700 * MB < warning["expected_bytes"] < 900 * MB
    assert warning["headroom_bytes"] <= 640 * MB
    assert updates[-1].oom is not None and updates[-1].oom["device"] == "cpu"
    assert "memory: actor_update grew the host memory by" in done.stderr
    assert "step 5 has 200 tokens: expect" in done.stderr
    # diagnose puts the warning beside the out-of-memory it foretold.
    assert verl_events_main(["diagnose", str(tmp_path / "run"), "--json"]) == 1
    first = json.loads(capsys.readouterr().out)["first"]
    assert (first["kind"], first["step"], first["stage"]) == ("oom", 5, "actor_update")
    assert "the forecast warned when it began: " in first["detail"]
    assert "more expected for 200 tokens" in first["detail"] and "left (RLIMIT_AS)" in first["detail"]


class SmallCuda(StandInCuda):
    """The stand-in device with 16 GiB in all (another process holds 1 GiB)."""

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return 16 * 2**30 - self.reserved - 2**30, 16 * 2**30


def run_on_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schedule: list[int]
) -> tuple[list[MemoryRecord], list[AnomalyEvent]]:
    cuda = SmallCuda()
    monkeypatch.setattr("verl_events.observers.memory.observer.device_module", lambda: ("cuda", cuda))
    cuda.alloc(4 * 2**30)  # the model
    sent: list[AnomalyEvent] = []

    def receive(sender: str, *, event: AnomalyEvent) -> None:
        sent.append(event)

    with anomaly.connected_to(receive):
        with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "memory"}]}):
            for step, tokens in enumerate(schedule, start=1):
                with stage("actor_compute_log_prob", role="actor", step=step, inputs=batch(tokens)):
                    pass
                with stage("actor_update", role="actor", step=step):
                    cuda.alloc(tokens * 64 * MB)  # activations: 64 MiB a token
                    cuda.allocated -= tokens * 64 * MB
                    cuda.reserved = cuda.allocated  # emptied: each step starts from the model
    return records(tmp_path), sent


def test_on_a_device_the_forecast_compares_with_what_the_device_has_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found, sent = run_on_device(tmp_path, monkeypatch, [16, 32, 48, 64, 192])
    assert [(e.step, e.stage, e.metric, e.rule) for e in sent] == [
        (5, "actor_update", "memory_forecast/device_bytes", "forecast")
    ]
    assert sent[0].value == 12 * 2**30  # 192 tokens at 64 MiB
    assert sent[0].baseline == 11 * 2**30  # 16 GiB less the model's 4 and the other process's 1
    [warning] = [r for r in found if r.forecast][0].forecast  # type: ignore[index]
    assert (warning["kind"], warning["limit"]) == ("device", "device")


def test_healthy_runs_whose_tokens_go_up_and_down_never_warn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = [64, 16, 96, 32, 160, 48, 128, 8]  # at most 10 GiB on the 11 GiB left
    found, sent = run_on_device(tmp_path / "device", monkeypatch, schedule)
    assert sent == []
    assert all(r.forecast is None for r in found)
    assert [r.tokens for r in found if r.stage == "actor_update"] == schedule
    monkeypatch.undo()
    with verl_events.install({"save_path": str(tmp_path / "host"), "observers": [{"name": "memory"}]}):
        for step, tokens in enumerate(schedule, start=1):
            with stage("actor_compute_log_prob", role="actor", step=step, inputs=batch(tokens)):
                pass
            with stage("actor_update", role="actor", step=step):
                held = torch.ones(tokens * MB // 4)
                del held
    assert all(r.forecast is None for r in records(tmp_path / "host"))


def test_a_forecast_option_that_is_not_a_boolean_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"option forecast: 'yes' is not allowed; use true or false"):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "memory", "forecast": "yes"}]})


def test_without_the_forecast_no_tokens_are_read(tmp_path: Path) -> None:
    config = {"save_path": str(tmp_path), "observers": [{"name": "memory", "forecast": False}]}
    with verl_events.install(config):
        with stage("actor_compute_log_prob", role="actor", step=1, inputs=batch(64)):
            pass
    [line] = memory_log_path(tmp_path, 0).read_text().splitlines()
    assert json.loads(line)["tokens"] is None
