"""verl-events report --trace: the timeline read back as Perfetto imports it, on real demo runs.

Perfetto's JSON import turns each ``ts`` and ``dur`` (microseconds) into integer
nanoseconds, ``int64(value * 1000)`` for a JSON double (trace_processor's json_utils
``CoerceToTs``: truncation), and on each track drops a complete event that begins inside an
open slice and ends after it.  :func:`dropped` replays that, with truncation and with
rounding alike, so the check holds whichever a reader does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from verl_events.apps.cli import main

from .conftest_runs import demo_run

pytestmark = pytest.mark.slow

TO_NS: dict[str, Callable[[float], int]] = {
    "truncated": lambda us: math.trunc(us * 1000),
    "rounded": lambda us: round(us * 1000),
}


def dropped(events: list[dict[str, Any]], to_ns: Callable[[float], int]) -> list[dict[str, Any]]:
    """The complete events Perfetto would drop as overlapping: per (pid, tid), in ``ts`` order
    (file order among equal ones), an event that starts inside an open slice and ends after it."""
    lost = []
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for event in events:
        if event["ph"] == "X":
            tracks.setdefault((event["pid"], event["tid"]), []).append(event)
    for slices in tracks.values():
        open_ends: list[int] = []
        for event in sorted(slices, key=lambda e: to_ns(e["ts"])):
            start = to_ns(event["ts"])
            end = start + to_ns(event["dur"])
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            if open_ends and end > open_ends[-1]:
                lost.append(event)
                continue
            open_ends.append(end)
    return lost


def trace_of(run: Path, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "timeline.json"
    assert main(["report", str(run), "--trace", str(path), "--quiet"]) == 0
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/report-and-compare.md's run: the demo, 3 steps, msprobe on steps 1-2."""
    pytest.importorskip("torch")
    pytest.importorskip("msprobe")
    return demo_run(tmp_path_factory.mktemp("demo") / "run", "--steps", "3")


def test_perfetto_drops_no_slice_of_the_demos_timeline(demo: Path, tmp_path: Path) -> None:
    events = trace_of(demo, tmp_path)["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    # 3 steps of 6 stages, each with timing's begin and end hooks and its body; steps 1-2 of
    # 3 stages profiled: msprobe's begin and end hooks too (84 slices, as the issue counted)
    assert len(slices) == 3 * 6 * 4 + 2 * 3 * 2
    for how, to_ns in TO_NS.items():
        assert dropped(events, to_ns) == [], how


def test_each_stages_hooks_and_body_meet_edge_to_edge_inside_it(demo: Path, tmp_path: Path) -> None:
    events = trace_of(demo, tmp_path)["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    for how, to_ns in TO_NS.items():
        stage = None
        for event in slices:
            start, end = to_ns(event["ts"]), to_ns(event["ts"]) + to_ns(event["dur"])
            if "cat" not in event:  # a stage: the pieces after it tile it
                stage, cursor = (start, end), start
                continue
            assert stage is not None and start == cursor and end <= stage[1], (how, event)
            cursor = end
        assert cursor == stage[1], how  # type: ignore[index]


def test_the_replay_catches_a_hook_that_ends_after_its_stage() -> None:
    """The check itself can fail: a hook 1 ns past its stage's end is dropped."""
    events = [
        {"ph": "X", "pid": 0, "tid": 0, "name": "actor_update", "ts": 10.00025, "dur": 5.00025},
        {"ph": "X", "pid": 0, "tid": 0, "name": "body", "ts": 10.00025, "dur": 5.00125},
    ]
    for to_ns in TO_NS.values():
        assert [e["name"] for e in dropped(events, to_ns)] == ["body"]


def test_times_start_at_the_runs_first_stage_and_its_epoch_is_kept(demo: Path, tmp_path: Path) -> None:
    trace = trace_of(demo, tmp_path)
    starts = [e["ts"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert min(starts) < 1.0  # microseconds from the origin, not from 1970
    first_line = json.loads((demo / "timing" / "rank0.jsonl").read_text().splitlines()[0])
    assert trace["otherData"]["origin_unix_s"] < first_line["end_unix"] < trace["otherData"]["origin_unix_s"] + 60


def test_each_step_is_marked_where_it_began(demo: Path, tmp_path: Path) -> None:
    events = trace_of(demo, tmp_path)["traceEvents"]
    marks = {e["name"]: e["ts"] for e in events if e["ph"] == "i" and e["s"] == "g"}
    assert list(marks) == ["step 1", "step 2", "step 3"]
    for step, at in enumerate(marks.values(), 1):
        firsts = [e["ts"] for e in events if e["ph"] == "X" and e.get("args", {}).get("step") == step]
        assert at == min(firsts)


def test_anomalies_are_instants_on_their_ranks_track(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("msprobe")
    config = Path(__file__).resolve().parents[1] / "examples" / "sentinel.yaml"
    run = demo_run(tmp_path / "run", "--config", str(config), "--steps", "3", "--inject", "nan@2")
    anomalies = [json.loads(line) for line in (run / "anomalies.jsonl").read_text().splitlines() if line.strip()]
    assert anomalies  # the NaN was seen
    events = trace_of(run, tmp_path)["traceEvents"]
    instants = [e for e in events if e["ph"] == "i" and e.get("cat") == "anomaly"]
    assert len(instants) == len(anomalies)
    assert {(e["pid"], e["args"]["step"], e["args"]["stage"]) for e in instants} == {
        (a["rank"], a["step"], a["stage"]) for a in anomalies
    }
    for how, to_ns in TO_NS.items():
        assert dropped(events, to_ns) == [], how
