"""Demo runs shared by the report and compare tests (each costs a few seconds)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .support import verl_events_exe


def demo_run(root: Path, *args: str) -> Path:
    result = subprocess.run(
        [verl_events_exe(), "demo", "--save-path", str(root), *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return root
