"""docs/quickstart.md's section 3 ("Use it in your code"), run as written, twice in a row in one
folder as a user would: it dumps ``actor_update`` at the two steps it selects and times all
three, says nothing of an unknown step, and ``verl-events report`` reads the run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("msprobe")

from .support import REPO, verl_events_exe

QUICKSTART = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")


def snippet() -> str:
    section = QUICKSTART.split("## 3. Use it in your code", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    return code


def test_section_3_dumps_the_selected_steps_and_report_reads_it_twice_in_a_row(tmp_path: Path) -> None:
    (tmp_path / "quickstart.py").write_text(snippet())
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "quickstart.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "unknown step" not in done.stderr, done.stderr[-3000:]
        latest = (tmp_path / "outputs/quickstart/latest").resolve()
        runs.append(latest)
        dumped = sorted(p.relative_to(latest).parts[0] for p in latest.rglob("dump.json"))
        assert dumped == ["step_1", "step_2"], dumped
        report = subprocess.run(
            [verl_events_exe(), "report", "outputs/quickstart/latest", "--json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert report.returncode == 0, report.stderr
        assert json.loads(report.stdout)["headline"]["steps"] == 3, report.stdout[:2000]
    assert runs[0] != runs[1]  # a folder per run
