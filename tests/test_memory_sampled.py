"""``peak: sampled``: the memory observer's peaks read by its own thread (issue 28's cheap hooks).

Real allocations, a real sampling thread.  No assertion depends on how fast this machine
is: the stages that must not share an interval are a long sleep apart, and a spike
shorter than the interval must still be seen whatever the timing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import verl_events
from verl_events import ConfigError, stage
from verl_events.observers.memory.host import read_status
from verl_events.observers.memory.record import MemoryRecord, memory_log_path

from .memory_support import MB, StandInCuda, allocate

pytestmark = pytest.mark.skipif(read_status() is None, reason="needs Linux /proc/self/status")


def records(save_path: Path) -> list[MemoryRecord]:
    return [MemoryRecord.from_json(line) for line in memory_log_path(save_path, 0).read_text().splitlines()]


def sampled(save_path: Path, interval_s: float) -> dict[str, object]:
    return {"save_path": str(save_path), "observers": [{"name": "memory", "peak": "sampled", "interval_s": interval_s}]}


def test_a_spike_shorter_than_the_interval_is_seen_and_every_line_is_written_by_close(tmp_path: Path) -> None:
    """An interval of 60 s: the thread never samples before close, so both lines come from the
    sample close takes, and the 512 MB spike, long gone by then, is in the first one's peak."""
    with verl_events.install(sampled(tmp_path, 60)):
        with stage("actor_update", role="actor", step=1):
            allocate(512)
        assert not memory_log_path(tmp_path, 0).exists()  # not sampled yet: nothing written
    (update,) = records(tmp_path)
    assert update.host_peak == "sampled"
    assert update.host_peak_bytes - update.host_begin_bytes >= 500 * MB  # type: ignore[operator]
    assert update.host_end_bytes - update.host_begin_bytes < 100 * MB  # type: ignore[operator]


def test_stages_a_long_sleep_apart_each_get_their_own_peak(tmp_path: Path) -> None:
    with verl_events.install(sampled(tmp_path, 0.01)):
        with stage("actor_update", role="actor", step=1):
            allocate(512)
        time.sleep(0.5)  # fifty intervals: the next stage's intervals are past the spike
        with stage("ref_compute_log_prob", role="ref", step=1):
            time.sleep(0.05)
    update, ref = records(tmp_path)
    assert update.host_peak_bytes - update.host_begin_bytes >= 500 * MB  # type: ignore[operator]
    assert ref.host_peak_bytes - ref.host_begin_bytes < 50 * MB  # type: ignore[operator]


def test_on_a_device_the_sampler_folds_the_allocators_peak_into_the_open_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = StandInCuda()  # checked against torch.cuda's signatures in tests/test_memory.py
    monkeypatch.setattr("verl_events.observers.memory.observer.device_module", lambda: ("cuda", cuda))
    cuda.alloc(4 * 2**30)
    with verl_events.install(sampled(tmp_path, 60)):
        with stage("actor_update", role="actor", step=1):
            cuda.alloc(6 * 2**30)
            cuda.allocated -= 6 * 2**30
    (update,) = records(tmp_path)
    assert update.device_peak_bytes == 10 * 2**30
    assert update.device is not None and update.device["peak_reserved"] == 10 * 2**30


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"peak": "sometimes"}, "option peak: 'sometimes' is not allowed; use reset or sampled"),
        ({"interval_s": 0.1}, "option interval_s: 0.1 is not allowed with peak: reset; it is peak: sampled's"),
        (
            {"peak": "sampled", "interval_s": 0},
            "option interval_s: 0 is not allowed; use a number of seconds from 0.001 to 60",
        ),
        ({"peak": "sampled", "interval_s": "1s"}, "option interval_s: '1s' is not allowed; use a number or null"),
    ],
)
def test_bad_sampling_options_are_refused_with_a_sentence(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "memory", **options}]})
