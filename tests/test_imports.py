"""The core and the observer modules import no tool library at import time."""

from __future__ import annotations

import subprocess
import sys

TOOLS = ("torch", "msprobe", "nvtx", "torch_npu", "verl", "ray", "omegaconf", "matplotlib")


def test_importing_the_packages_loads_no_tool_library() -> None:
    script = f"import sys, verl_events, verl_events.testing, verl_events.observers; print([m for m in {TOOLS!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_public_names_are_exported() -> None:
    import verl_events
    from verl_events import observers

    assert all(hasattr(verl_events, name) for name in verl_events.__all__)
    assert all(hasattr(observers, name) for name in observers.__all__)
