"""The custom-observer path end to end: pip-install the example package into a temporary
target (never into the running venv), then load its observer by entry-point name from
YAML in a fresh interpreter that has the target on its path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the example observer watches tensors

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

EXAMPLE = Path(__file__).parent.parent / "examples" / "custom_observer"


@pytest.fixture(scope="module")
def nanwatch_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of an interpreter that has the example package installed."""
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-build-isolation", "--target", str(target), str(EXAMPLE)],
        check=True,
        capture_output=True,
    )
    path = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def test_the_running_venv_does_not_have_it() -> None:
    from verl_events.config import available_observers

    assert "nan_watch" not in available_observers()


def test_an_installed_observer_package_loads_by_name_from_yaml(nanwatch_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "observers.yaml"
    config.write_text(f"save_path: {tmp_path}\nobservers:\n  - name: nan_watch\n    stages: [actor_update]\n")
    script = textwrap.dedent(
        f"""
        import logging, torch, verl_events
        logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        with torch.no_grad():
            model[2].weight[0, 0] = float("nan")
        with verl_events.install({str(config)!r}) as installation:
            print("loaded", type(installation.observers[0]).__name__)
            for step in (1, 2):
                with verl_events.stage("actor_update", step=step, model=model):
                    model(torch.ones(2, 4))
                with verl_events.stage("critic_update", step=step, model=model):
                    model(torch.ones(2, 4))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=nanwatch_env
    )
    assert result.returncode == 0, result.stderr
    assert "loaded NanWatchObserver" in result.stdout
    found = [line for line in result.stderr.splitlines() if line.startswith("nanwatch ")]
    assert found == [
        "nanwatch stage 'actor_update' (step 1, rank 0): first non-finite output from module '2'",
        "nanwatch stage 'actor_update' (step 2, rank 0): first non-finite output from module '2'",
    ]


def test_the_example_observer_is_listed_once_installed(nanwatch_env: dict[str, str]) -> None:
    listed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from verl_events.config import available_observers; print(sorted(available_observers()))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=nanwatch_env,
    ).stdout
    assert "'nan_watch'" in listed


def test_the_pages_observer_by_import_path_loads_in_check_from_its_folder_twice_and_elsewhere_says_why(
    tmp_path: Path,
) -> None:
    """docs/custom-observers.md: its slow_alarm.py as written, beside a config naming it by
    ``_target_``; ``verl-events check`` from that folder builds it (twice in a row), from
    another it names the module and PYTHONPATH."""
    import re

    from .support import REPO, verl_events_exe

    page = (REPO / "docs" / "custom-observers.md").read_text(encoding="utf-8")
    module = next(b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if b.startswith("# slow_alarm.py"))
    (tmp_path / "slow_alarm.py").write_text(module)
    (tmp_path / "observers.yaml").write_text("observers:\n  - _target_: slow_alarm:SlowStageAlarm\n    seconds: 30\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for _ in range(2):
        here = subprocess.run(
            [verl_events_exe(), "check", "observers.yaml"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert here.returncode == 0, here.stderr
        assert "from _target_ slow_alarm:SlowStageAlarm" in here.stdout and "seconds=30" in here.stdout
    elsewhere = subprocess.run(
        [verl_events_exe(), "check", str(tmp_path / "observers.yaml")],
        cwd=tmp_path.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    assert elsewhere.returncode == 2
    assert "no module 'slow_alarm' on Python's path" in elsewhere.stderr
    assert "the folder that holds slow_alarm.py on PYTHONPATH" in elsewhere.stderr
