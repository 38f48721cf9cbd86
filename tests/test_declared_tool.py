"""A tool from another package, declared once on its observer class and registered by its
entry point alone, is found by install, ``verl-events check``, ``verl-events diagnose`` and
the CLI, with no edit of ours.

The package is written to a temporary folder with a ``.dist-info`` holding its entry point,
as pip would install it, and every command runs in a fresh process with that folder on
PYTHONPATH, as a user's would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import support

OBSERVER = '''
from pathlib import Path

from verl_events import InstallContext, Observer, StageEnd, Writes, prepare_output_dir


def toy_files(save_path: Path) -> list[Path]:
    return sorted((Path(save_path) / "toy").glob("*.txt"))


class ToyObserver(Observer):
    """Writes one line per stage it sees."""

    writes = Writes("toy file(s)", toy_files, "toy", "toy_tool.command")

    def setup(self, context: InstallContext) -> None:
        self.folder = prepare_output_dir(Path(context.save_path) / "toy")

    def on_stage_end(self, event: StageEnd) -> None:
        with open(self.folder / f"rank{event.rank}.txt", "a") as out:
            out.write(f"{event.stage} {event.step}\\n")
'''

COMMAND = """
from pathlib import Path

from toy_tool import toy_files


def add_command(commands):
    parser = commands.add_parser("toy", help="count the toy lines of a run")
    parser.add_argument("run", type=Path)
    parser.set_defaults(run_command=command)


def command(args) -> int:
    lines = sum(len(path.read_text().splitlines()) for path in toy_files(args.run))
    print(f"toy: {lines} line(s)")
    return 0
"""


def make_package(root: Path) -> None:
    package = root / "toy_tool"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(OBSERVER))
    (package / "command.py").write_text(textwrap.dedent(COMMAND))
    info = root / "toy_tool-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-tool\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[verl_events.observers]\ntoy = toy_tool:ToyObserver\n")


def run(root: Path, *argv: str, run_id: str = "toy-run") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(support.REPO)]), "VERL_EVENTS_RUN_ID": run_id}
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root, timeout=120)


@pytest.mark.slow
def test_a_tool_declared_by_another_package_is_found_by_install_check_diagnose_and_the_cli(tmp_path: Path) -> None:
    make_package(tmp_path)
    save_path = tmp_path / "run"
    script = (
        "import verl_events\n"
        f"with verl_events.install({{'save_path': {str(save_path)!r}, 'observers': [{{'name': 'toy'}}]}}):\n"
        "    with verl_events.stage('actor_update', step=1):\n"
        "        pass\n"
    )
    made = run(tmp_path, sys.executable, "-c", script)
    assert made.returncode == 0, made.stderr
    assert (save_path / "toy/rank0.txt").read_text() == "actor_update 1\n"

    # install: a process of the same run joins the save_path; another run's is kept out by the toy files.
    again = run(tmp_path, sys.executable, "-c", script)
    assert again.returncode == 0, again.stderr
    other = run(tmp_path, sys.executable, "-c", script, run_id="another-run")
    assert other.returncode != 0 and "already holds 1 toy file(s)" in other.stderr, other.stderr

    exe = support.verl_events_exe()
    config = tmp_path / "observers.yaml"
    config.write_text(f"save_path: {save_path}\nobservers:\n  - name: toy\n")
    checked = run(tmp_path, exe, "check", str(config))
    assert checked.returncode == 0, checked.stderr
    assert "holds 1 toy file(s)" in checked.stdout + checked.stderr, checked.stdout

    diagnosed = run(tmp_path, exe, "diagnose", str(save_path), "--json")
    assert diagnosed.returncode == 0, diagnosed.stderr
    tools = json.loads(diagnosed.stdout)["tools"]
    assert {"tool": "toy", "summary": "1 toy file(s)", "command": f"verl-events toy {save_path}"} in tools

    counted = run(tmp_path, exe, "toy", str(save_path))
    assert (counted.returncode, counted.stdout) == (0, "toy: 2 line(s)\n"), counted.stderr
    assert "toy" in run(tmp_path, exe, "--help").stdout
