"""What an install puts into site-packages: only verl_events, never a top-level ``observers``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

REPO = Path(__file__).parent.parent


def test_this_install_has_no_top_level_observers_and_the_built_ins_under_verl_events(tmp_path: Path) -> None:
    """Run outside the checkout, where the repository's observers/ folder is not on the path."""
    script = (
        "import importlib.util, verl_events.observers.msprobe as m\n"
        "print(importlib.util.find_spec('observers'), m.MsprobeObserver.__module__)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["None", "verl_events.observers.msprobe.observer"]


def test_the_top_level_folders_verl_and_transferqueue_install_never_shadow_this_checkouts() -> None:
    """verl's and TransferQueue's wheels put top-level ``tests/``, ``scripts/``, ``recipe/`` and
    ``tutorial/`` folders into site-packages (verl's ``tests`` a regular package). Of this
    checkout's folders only ``tests`` shares a name with one of them, and it is ours both in this
    pytest process and in a child started from another folder with the checkout on PYTHONPATH,
    as the trainer tests start verl's workers (``tests.support`` observers)."""
    import tests

    installed = {p.name for site in map(Path, sys.path) if site.name == "site-packages" for p in site.iterdir()}
    ours = {p.name for p in REPO.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert ours & installed & {"tests", "scripts", "recipe", "tutorial"} <= {"tests"}
    assert Path(tests.__file__).parent == REPO / "tests"
    script = "import tests.support; print(tests.support.__file__)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd="/", env=env, capture_output=True, text=True, check=True
    )
    assert Path(result.stdout.strip()) == REPO / "tests/support.py"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, as docs/quickstart.md builds it."""
    # From a copy of the sources: setuptools builds in the source tree, and an old
    # build/ folder would leak into the wheel.
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".*", "build", "outputs", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(root), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    (built,) = root.glob("verl_events-*.whl")
    return built


def test_a_wheel_holds_only_verl_events_and_its_dist_info(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"verl_events"}
    assert "verl_events/observers/msprobe/observer.py" in names and "verl_events/apps/verl_cpu/shim.py" in names
    assert "verl_events/observers/msprobe/configs/statistics_L1.json" in names  # config_path: statistics_L1
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "msprobe = verl_events.observers.msprobe:MsprobeObserver" in zipfile.ZipFile(wheel).read(entry_points).decode()
    )


OBSERVERS_YAML = """\
save_path: out/{run}
observers:
  - name: timing
  - name: msprobe
    config_path: mine.json          # beside this file, whatever the working directory
    stages: [actor_update]
  - name: msprobe
    config_path: statistics_L1      # shipped with the package
    stages: [critic_update]
"""

TRAIN = """\
import torch, verl_events
model = torch.nn.Linear(4, 2)
with verl_events.install("configs/observers.yaml"):
    for name in ("actor_update", "critic_update"):
        with verl_events.stage(name, step=1, model=model):
            model(torch.ones(3, 4)).sum().backward()
"""


def test_the_wheel_installs_with_msprobe_into_a_fresh_venv_and_runs_a_config_from_another_folder(
    wheel: Path, tmp_path: Path
) -> None:
    """docs/quickstart.md's route outside the clone: a fresh venv, torch first, the wheel with [msprobe]."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "--quiet", "--disable-pip-version-check", "install"]
    subprocess.run([*pip, "torch==2.13.0"], check=True, timeout=900)
    subprocess.run([*pip, f"{wheel}[msprobe]"], check=True, timeout=900)
    work = tmp_path / "work"
    (work / "configs").mkdir(parents=True)
    (work / "configs/observers.yaml").write_text(OBSERVERS_YAML)
    shutil.copy(REPO / "verl_events/observers/msprobe/configs/statistics_L1.json", work / "configs/mine.json")
    for _ in range(2):  # twice in a row: each run has its own folder
        run = subprocess.run(
            [str(venv / "bin/python"), "-c", TRAIN], cwd=work, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, run.stderr[-3000:]
    runs = sorted(p.name for p in (work / "out").iterdir())
    assert len(runs) == 3 and "latest" in runs, runs
    for stage in ("actor_update", "critic_update"):
        assert (work / f"out/latest/step_1/{stage}/step0/rank0/dump.json").is_file()
