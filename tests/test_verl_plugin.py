"""verl's plugin hook: ``import verl`` loads verl_events.verl_plugin in every process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")  # verl's plugin loader is what these tests drive

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

PROBE = (
    "import sys, verl, verl_events\n"
    "loaded = sorted(m for m in sys.modules if m.startswith('verl_events.'))\n"
    "from verl_events.verl_bridge import verl_bridge_installed\n"
    "print(verl_bridge_installed(), verl_events.current_installation())\n"
)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "VERL_EVENTS_CONFIG"} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)


def test_without_the_variable_import_verl_installs_nothing() -> None:
    result = run_python(PROBE + "print(loaded)")
    assert result.returncode == 0, result.stderr
    installed, modules = result.stdout.splitlines()
    assert installed == "False None"
    assert modules == "['verl_events.verl_plugin']"  # the package's names load on first use


def test_the_variable_alone_installs_the_bridge_and_the_observers(tmp_path: Path) -> None:
    config = tmp_path / "observers.yaml"
    config.write_text(f"save_path: {tmp_path / 'out'}\nobservers:\n  - name: timing\n")
    result = run_python(PROBE, VERL_EVENTS_CONFIG=str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("True <Installation [timing]>")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file"),
        ("observers:\n  - name: no_such_tool\n", "no_such_tool"),
    ],
)
def test_a_bad_config_stops_the_process_at_import_with_one_line(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    """verl's loader swallows a plugin's Exception; ours must still stop the process."""
    config = tmp_path / "observers.yaml"
    if content is not None:
        config.write_text(content)
    result = run_python("import verl\nprint('training would start')", VERL_EVENTS_CONFIG=str(config))
    assert result.returncode == 1
    assert "training would start" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"verl_events: VERL_EVENTS_CONFIG='{config}' could not be installed: ") and reason in last
