"""Demo runs shared by the report and compare tests (each costs a few seconds)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def demo_run(root: Path, *args: str) -> Path:
    exe = shutil.which("verl-events", path=str(Path(sys.executable).parent))
    assert exe is not None
    result = subprocess.run([exe, "demo", "--save-path", str(root), *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return root
