"""Every shell command in README.md and docs/ runs as written, twice in a row, as users do.

Each ```bash block is either run here (in a fresh folder with a copy of
examples/, the venv's commands first on PATH), run by another test that
says so, or listed in NOT_RUN_HERE with why it cannot run on this machine.
A new block that is none of these fails the first test, so no documented
command goes unchecked.  A command may end in ``# exits N``; every other
command must exit 0, both times.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the demo trains with torch and dumps with msprobe
pytest.importorskip("msprobe")

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# (file, text in the block's first command) -> the test that runs it twice
RUN_ELSEWHERE = {
    (
        "docs/sentinel.md",
        "verl-events demo --config examples/sentinel.yaml",
    ): "tests/test_sentinel_demo.py, tests/test_triage_replay.py",
    ("docs/sentinel.md", "verl-events demo --config examples/sentinel_spike.yaml"): "tests/test_sentinel_demo.py",
    ("docs/sentinel.md", "pytest tests/test_sentinel_healthy.py"): "those tests themselves (the command runs them)",
    ("docs/msprobe.md", ""): "tests/test_msprobe_tools.py (the msprobe tools section, block by block)",
    ("docs/quickstart.md", "pip install torch==2.13.0"): "tests/test_packaging.py (the wheel in a fresh venv)",
    ("docs/quickstart.md", "bash scripts/demo.sh"): "this test, on README.md's block: the same command",
    ("docs/trackers.md", "verl-events demo --config examples/tracker.yaml"): "tests/observers/test_tracker.py",
    (
        "docs/mismatch.md",
        "VERL_EVENTS_CONFIG=/shared/mismatch.yaml",
    ): "tests/test_verl_mismatch.py (verl's trainer on the CPU job, twice in a row)",
    ("docs/mismatch.md", "verl-events mismatch /shared/"): "tests/test_verl_mismatch.py (twice on each run)",
    ("docs/weight-sync.md", "verl-events weights /shared/"): "tests/test_verl_weight_sync.py (twice, on the doc's run)",
    (
        "docs/checkpoints.md",
        "verl-events ",
    ): "tests/test_verl_checkpoints.py (twice, on the doc's runs of verl's trainer with two FSDP ranks)",
    ("docs/verl.md", "verl-events gather"): "tests/test_verl_replay.py (twice, on two Ray nodes of one machine)",
}
#: The test command itself (README.md): it runs this test, so it is not run from here.
TEST_COMMAND = "bash scripts/test.sh"
# (file, text in the block's first command) -> why it cannot run here
NOT_RUN_HERE = {
    ("README.md", "python3 -m verl.trainer.main_ppo"): "a user's own verl job (...your usual arguments)",
    ("docs/sentinel.md", "python3 -m verl.trainer.main_ppo"): "a user's own verl job (...your usual arguments)",
    ("docs/verl.md", "python3 -m verl.trainer.main_ppo"): "a user's own verl job; tests/test_verl_trainer.py runs it",
    ("docs/verl.md", "pip install"): "installs into the user's training environment",
    ("docs/quickstart.md", "pip install '.[verl-cpu]'"): "installs; tests/test_demo_verl.py runs the demo",
    ("docs/profilers.md", "nsys profile"): "needs NVIDIA's nsys and a CUDA device",
    ("docs/performance.md", "benchmarks/"): "benchmarks: minutes each, their figures are in the doc",
    ("docs/report-and-compare.md", "runs/fp32"): "illustrates the forms of the arguments, on the reader's runs",
    ("docs/trackers.md", "tensorboard --logdir"): "TensorBoard's web server; test_tracker.py reads its files",
}


def blocks() -> list[tuple[str, str]]:
    """Every bash block of the docs: (file relative to the repo, its text)."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S):
            found.append((doc.relative_to(REPO).as_posix(), block))
    return found


def first_command(block: str) -> str:
    return next(line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def listed(table: dict[tuple[str, str], str], doc: str, block: str) -> str | None:
    command = first_command(block)
    return next((why for (file, text), why in table.items() if file == doc and text in command), None)


def runnable() -> list[tuple[str, str]]:
    return [(d, b) for d, b in blocks() if listed(RUN_ELSEWHERE, d, b) is None and listed(NOT_RUN_HERE, d, b) is None]


def test_every_block_is_run_or_says_why_not() -> None:
    assert len(runnable()) >= 5  # the README's demo, the quickstart, report-and-compare, performance
    for (doc, text), why in {**RUN_ELSEWHERE, **NOT_RUN_HERE}.items():
        assert any(d == doc and text in first_command(b) for d, b in blocks()), f"{doc}: no block {text!r} ({why})"


def commands(block: str) -> list[tuple[str, int]]:
    """The block's commands (continuation lines joined), each with the exit code it expects."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#") or line.startswith(TEST_COMMAND):
            continue
        expected = re.search(r"#\s*exits (\d+)", line)
        found.append((line, int(expected.group(1)) if expected else 0))
    return found


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    return tmp_path


@pytest.mark.parametrize(("doc", "block"), runnable(), ids=lambda value: str(value)[:60])
def test_the_block_runs_twice_in_a_row(doc: str, block: str, workdir: Path) -> None:
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("VERL_EVENTS_RUN_ID", None)  # each command is a run of its own, as in a shell
    for attempt in (1, 2):
        for command, expected in commands(block):
            # .venv/bin/... in the docs means this venv's commands; scripts/ run from the repository.
            command = command.replace(".venv/bin/", f"{venv_bin}/")
            cwd = REPO if command.startswith("bash scripts/") else workdir
            result = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
            assert result.returncode == expected, (
                f"{doc}, run {attempt}: {command!r} exited {result.returncode}, not {expected}\n{result.stderr[-3000:]}"
            )
            if attempt == 2:
                run_each_suggestion(result.stdout + result.stderr, cwd, env, f"{doc}: {command!r}")


#: Where an output suggests a command: ``verl-events COMMAND`` and what follows, to the first
#: punctuation that ends a sentence or a bracket (:func:`command_words` keeps its arguments).
SUGGESTED = re.compile(r"verl-events [a-z]+(?: (?!verl-events)[^\s,;()'\"`]+)*")


def command_words(text: str) -> list[str]:
    """The command of a suggestion, without the prose after it: the first argument (RUN),
    options and their values, and later arguments that are paths
    (``verl-events diagnose outputs/x tells what it means`` is ``verl-events diagnose outputs/x``)."""
    words = text.rstrip(".:").split()
    kept = words[:3]
    for word in words[3:]:
        if not (word.startswith("-") or "/" in word or kept[-1].startswith("--")):
            break
        kept.append(word.rstrip(".:"))
    return kept


def run_each_suggestion(output: str, cwd: Path, env: dict[str, str], where: str) -> None:
    """Every ``verl-events ...`` the output suggests, run as printed from the same folder: none
    is bad input (exit 2) or a traceback.  A syntax line (``verl-events report RUN``) is no
    suggestion; gather needs a Ray cluster (tests/test_verl_replay.py runs the doc's)."""
    for words in {tuple(command_words(match)): None for match in SUGGESTED.findall(output)}:
        suggestion = " ".join(words)
        if words[1] == "gather" or any(re.fullmatch(r"[A-Z]{3,}", word) for word in words):
            continue
        print(f"suggested: {suggestion}")
        pasted = subprocess.run(list(words), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        said = pasted.stdout + pasted.stderr
        assert pasted.returncode in (0, 1) and "Traceback" not in said, (
            f"{where} suggested {suggestion!r}, which exited {pasted.returncode}:\n{said[-3000:]}"
        )
