"""The core and the observer modules import no tool library at import time."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = ("torch", "msprobe", "nvtx", "torch_npu", "verl", "ray", "omegaconf", "matplotlib", "duckdb")


def test_importing_the_packages_loads_no_tool_library() -> None:
    script = (
        "import sys, verl_events, verl_events.testing, verl_events.observers; "
        f"print([m for m in {TOOLS!r} if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_public_names_are_exported() -> None:
    import verl_events
    from verl_events import observers

    assert all(hasattr(verl_events, name) for name in verl_events.__all__)
    assert all(hasattr(observers, name) for name in observers.__all__)


def test_the_old_top_level_names_still_resolve_with_a_deprecation_warning() -> None:
    import verl_events
    from verl_events.config import load_config

    with pytest.warns(DeprecationWarning, match=r"verl_events.load_config moved to verl_events.config.load_config"):
        assert verl_events.load_config is load_config
    with pytest.warns(DeprecationWarning, match="frozenset"):
        assert verl_events.KNOWN_STAGES == frozenset(verl_events.STAGE_ROLES)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        verl_events.nonsense  # noqa: B018


def test_the_tools_use_only_the_public_core() -> None:
    """verl_events.apps builds on what any user may import: no private module, no private name."""
    apps = Path(verl_events_dir(), "apps")
    offenders = []
    for path in sorted(apps.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                ours = node.level > 0 or module.startswith("verl_events")
                private_module = any(part.startswith("_") for part in module.split("."))
                private_name = any(alias.name.startswith("_") for alias in node.names)
                if ours and (private_module or private_name):
                    offenders.append(f"{path.relative_to(apps)}:{node.lineno}: from {'.' * node.level}{module}")
    assert offenders == []


def test_the_core_imports_no_tool_module() -> None:
    """The arrows point one way: nothing outside verl_events.apps imports it."""
    root = verl_events_dir()
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if "apps" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and ("apps" in (node.module or "").split(".")):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []


def verl_events_dir() -> Path:
    import verl_events

    return Path(verl_events.__file__).parent


def test_no_test_module_imports_from_another() -> None:
    """Shared helpers live in support modules; a test module or conftest is never imported."""
    tests = Path(__file__).parent
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                last = node.module.split(".")[-1]
                if last.startswith("test_") or last == "conftest":
                    offenders.append(f"{path.relative_to(tests)}:{node.lineno}: from {node.module}")
    assert offenders == []
