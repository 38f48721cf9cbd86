"""NsysObserver on CPU: real NVTX calls (the nvtx package works without a GPU, and is
spied on, not replaced).  CUDA is not available here, so the capture calls are checked
with a stand-in whose start/stop bind against the real torch.cuda.profiler signatures."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import nvtx
import pytest
import torch.cuda.profiler

import verl_events
from verl_events import ConfigError, ObserverSetupError, Selection, VerlEventsWarning, stage
from verl_events.observers.nsys import NsysObserver, capture_ranges, nsys_command


class CudaProfilerAPI:
    """Records start/stop, binding each call to torch.cuda.profiler's real signature."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, *args: Any, **kwargs: Any) -> None:
        inspect.signature(torch.cuda.profiler.start).bind(*args, **kwargs)
        self.calls.append("start")

    def stop(self, *args: Any, **kwargs: Any) -> None:
        inspect.signature(torch.cuda.profiler.stop).bind(*args, **kwargs)
        self.calls.append("stop")


class NvtxSpy:
    """Passes every call to the real nvtx module and remembers it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def start_range(self, **kwargs: Any) -> Any:
        self.calls.append(("start_range", kwargs))
        return nvtx.start_range(**kwargs)

    def end_range(self, handle: Any) -> None:
        self.calls.append(("end_range", {}))
        nvtx.end_range(handle)


def nsys_installation(tmp_path: Path, **options: object) -> tuple[Any, NsysObserver, NvtxSpy, CudaProfilerAPI]:
    with pytest.warns(
        VerlEventsWarning,
        match="CUDA is not available, so capture ranges .* are skipped; NVTX ranges are still emitted",
    ):
        installation = verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "nsys", **options}]})
    [observer] = installation.observers
    assert isinstance(observer, NsysObserver)
    spy, api = NvtxSpy(), CudaProfilerAPI()
    observer.nvtx = spy
    observer.cuda_profiler = api  # what setup stores when CUDA is available
    return installation, observer, spy, api


def run_steps(steps: range, stages: tuple[str, ...] = ("actor_compute_log_prob", "actor_update")) -> None:
    for step in steps:
        for name in stages:
            with stage(name, step=step):
                pass


def test_each_stage_is_an_nvtx_range_in_our_domain_with_the_role_as_category(tmp_path: Path) -> None:
    installation, _, spy, _ = nsys_installation(tmp_path)
    with installation:
        run_steps(range(1, 2))
        with stage("my_custom_stage", step=1):
            pass
    starts = [kwargs for name, kwargs in spy.calls if name == "start_range"]
    assert starts == [
        {"message": "actor_compute_log_prob", "domain": "verl_events", "category": "actor"},
        {"message": "actor_update", "domain": "verl_events", "category": "actor"},
        {"message": "my_custom_stage", "domain": "verl_events", "category": "stage"},
    ]
    assert [name for name, _ in spy.calls].count("end_range") == 3


def test_discrete_brackets_each_selected_stage_with_a_capture(tmp_path: Path) -> None:
    installation, _, _, api = nsys_installation(tmp_path, steps=[1, 2])
    with installation:
        run_steps(range(1, 4))
    assert api.calls == ["start", "stop"] * 4


def test_continuous_brackets_each_run_of_selected_steps(tmp_path: Path) -> None:
    installation, _, spy, api = nsys_installation(tmp_path, discrete=False, steps=[2, 3, 5])
    with installation:
        run_steps(range(1, 7))
    assert api.calls == ["start", "stop", "start", "stop"]  # steps 2-3, then 5
    assert [name for name, _ in spy.calls].count("start_range") == 6


def test_without_cuda_nvtx_ranges_still_work_and_nothing_is_captured(tmp_path: Path) -> None:
    with pytest.warns(VerlEventsWarning, match="CUDA is not available"):
        installation = verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "nsys"}]})
    with installation:
        assert installation.observers[0].cuda_profiler is None  # type: ignore[attr-defined]
        run_steps(range(1, 3))


def test_nsys_discrete_and_continuous_on_the_same_steps_are_rejected(tmp_path: Path) -> None:
    config = {
        "save_path": str(tmp_path),
        "observers": [
            {"name": "nsys", "steps": [1, 2]},
            {"name": "nsys", "discrete": False, "steps": [2, 3]},
        ],
    }
    # Refused before either is set up: no set-up warning (nvtx, CUDA) is emitted.
    with pytest.raises(
        ConfigError,
        match=r"observers 'nsys' and 'nsys#2' both need 'cuda_profiler_api' "
        r"\(the CUDA profiler API that nsys captures with\)",
    ):
        verl_events.install(config)


def test_missing_nvtx_warns_and_the_observer_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)
    with pytest.warns(
        VerlEventsWarning, match=r"the nvtx package is not importable .* pip install 'verl-events\[nsys\]'"
    ):
        installation = verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "nsys"}]})
    with installation:
        run_steps(range(1, 2))


def test_missing_nvtx_is_an_error_in_strict_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)
    with pytest.raises(ObserverSetupError, match="the nvtx package is not importable"):
        verl_events.install({"save_path": str(tmp_path), "strict": True, "observers": [{"name": "nsys"}]})


@pytest.mark.parametrize(
    ("steps", "stages", "discrete", "expected"),
    [
        ([1, 2], ["actor_update", "actor_compute_log_prob", "ref_compute_log_prob"], True, 6),
        ([1, 2, 3, 7, 8], None, False, 2),
        ([5], None, False, 1),
        ([1, 2], None, True, None),
        (None, None, False, None),
    ],
)
def test_capture_range_count_follows_the_selection(
    steps: Any, stages: Any, discrete: bool, expected: int | None
) -> None:
    sel = Selection.parse(steps=steps, stages=stages)
    assert capture_ranges(sel.steps, sel.stages, discrete) == expected


def test_the_nsys_command_carries_the_computed_shutdown_count() -> None:
    command = nsys_command(frozenset({1, 2, 3, 7}), None, discrete=False)
    assert "--capture-range=cudaProfilerApi" in command
    assert "--capture-range-end=repeat-shutdown:2" in command
    assert "--capture-range-end=repeat " in nsys_command(None, None, discrete=True)


def test_the_command_is_logged_at_install(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="verl_events.nsys")
    installation, _, _, _ = nsys_installation(tmp_path, discrete=False, steps=["3-4"])
    installation.close()
    assert "--capture-range-end=repeat-shutdown:1" in caplog.text
