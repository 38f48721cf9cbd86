"""What an install puts into site-packages: only verl_events, never a top-level ``observers``."""

from __future__ import annotations

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


def test_a_wheel_holds_only_verl_events_and_its_dist_info(tmp_path: Path) -> None:
    # From a copy of the sources: setuptools builds in the source tree, and an old
    # build/ folder would leak into the wheel.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".*", "build", "outputs", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = tmp_path.glob("verl_events-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"verl_events"}
    assert "verl_events/observers/msprobe/observer.py" in names and "verl_events/apps/verl_cpu/shim.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "msprobe = verl_events.observers.msprobe:MsprobeObserver" in zipfile.ZipFile(wheel).read(entry_points).decode()
    )
