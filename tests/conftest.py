from __future__ import annotations

import importlib.util
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import verl_events
from verl_events.layout import RUN_ID_ENV
from verl_events.testing import reset

# The core suite runs in a bare venv (bash scripts/test-core.sh): the suites that drive
# torch and the tools themselves are left out there, and the header says so.  A test
# module outside these folders that needs a tool skips with pytest.importorskip.
TOOL_SUITES = ("observers", "faults")
HAS_TORCH = importlib.util.find_spec("torch") is not None
collect_ignore = [] if HAS_TORCH else list(TOOL_SUITES)

# A shell without job control (a CI script's `cmd &`, nohup under sh) starts its background
# commands with SIGINT ignored, and that carries into every process they start: Python then
# never turns Ctrl-C into KeyboardInterrupt, and the tests that send a real SIGINT would test
# nothing.  Give this process, and so the processes it starts, Ctrl-C as a terminal gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header() -> str | None:
    return None if HAS_TORCH else f"torch is not installed: the core suite only ({', '.join(TOOL_SUITES)} left out)"


@pytest.fixture(autouse=True)
def _own_run_id() -> Iterator[None]:
    """A run id this process makes up goes into its environment; keep it from
    leaking into later tests and the processes they start (each would then
    count as the same run)."""
    saved = os.environ.pop(RUN_ID_ENV, None)
    yield
    os.environ.pop(RUN_ID_ENV, None)
    if saved is not None:
        os.environ[RUN_ID_ENV] = saved


@pytest.fixture(autouse=True)
def _clean_bus() -> Iterator[None]:
    """Every test starts and ends with nothing installed and no announced step."""
    yield
    reset()
    assert not verl_events.stage_begin.receivers, "a test left a receiver connected"


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Demo runs: two with the same seed, one with a perturbed actor weight, one on two ranks."""
    pytest.importorskip("torch")  # the demo trains with torch and dumps with msprobe
    pytest.importorskip("msprobe")
    from .conftest_runs import demo_run

    root = tmp_path_factory.mktemp("runs")
    return {
        "a": demo_run(root / "a", "--steps", "2"),
        "b": demo_run(root / "b", "--steps", "2"),
        "perturbed": demo_run(root / "perturbed", "--steps", "1", "--perturb", "0.01"),
        "two_ranks": demo_run(root / "two_ranks", "--steps", "3", "--nproc", "2"),
    }


#: Fixtures that run demos in processes of their own: a test using one is slow.
DEMO_FIXTURES = frozenset({"demo_runs", "module_runs"})


#: Test modules that start a Ray cluster or verl's trainer (which starts one): under
#: pytest-xdist they run one after another on one worker, as each takes most of the machine,
#: and a second cluster beside it would only slow both.
ONE_CLUSTER_AT_A_TIME = frozenset(
    {
        "test_demo_verl.py",
        "test_memory_ray_kill.py",
        "test_run.py",
        "test_verl_bridge.py",
        "test_verl_cpu_checkpoint_engine.py",
        "test_verl_generation.py",
        "test_verl_lora_sync.py",
        "test_verl_mismatch.py",
        "test_verl_postmortem.py",
        "test_verl_replay.py",
        "test_verl_stall.py",
        "test_verl_trainer.py",
        "test_verl_watchdog.py",
        "test_verl_weight_sync.py",
    }
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that reads demo runs waits for several demo processes: it is slow.

    With pytest-xdist (scripts/test.sh runs two workers, ``--dist loadgroup``), the Ray tests
    share one worker, and so do the tests of the session's demo runs, which each worker would
    otherwise make again; every other test goes to whichever worker is free.  First among the
    hooks: xdist's own reads the groups into the test ids in this hook, so they must be marked
    before it runs (with pytest 9.2 it cannot: pyproject.toml keeps pytest below 9)."""
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        demo = bool(DEMO_FIXTURES & set(getattr(item, "fixturenames", ())))
        if demo:
            item.add_marker(pytest.mark.slow)
        if not grouped:
            continue
        if item.path.name in ONE_CLUSTER_AT_A_TIME:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif demo:
            item.add_marker(pytest.mark.xdist_group("demo_runs"))
