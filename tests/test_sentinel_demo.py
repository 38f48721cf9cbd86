"""docs/sentinel.md's demo commands, run as written and twice in a row: the anomaly at
step 5, msprobe armed for step 6 only, triage naming the injected weight's op and its
source line, in the second run's own folder."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the demo trains with torch and dumps with msprobe
pytest.importorskip("msprobe")

from .support import verl_events_exe

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs/sentinel.md").read_text()


def demo_block(inject: str) -> list[list[str]]:
    """The bash block of the doc whose demo command injects ``inject``."""
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", DOC, flags=re.S) if f"--inject {inject}" in b]
    assert len(blocks) == 1, f"docs/sentinel.md should show one demo with --inject {inject}"
    return [shlex.split(line) for line in blocks[0].splitlines() if line.strip()]


def run_block(commands: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    results = []
    for argv in commands:
        assert argv[0] == "verl-events", argv
        results.append(
            subprocess.run([verl_events_exe(), *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=600)
        )
    return results


def anomalies(save_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (save_path / "anomalies.jsonl").read_text().splitlines()]


def dumped_steps(save_path: Path) -> list[str]:
    return sorted({p.relative_to(save_path).parts[0] for p in save_path.rglob("dump.json")})


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    return tmp_path


def run_twice(commands: list[list[str]], cwd: Path) -> tuple[list[subprocess.CompletedProcess[str]], Path]:
    """The block run twice in a row, as users do; the second run's results, and
    the folder its triage command reads (the doc's, from ``cwd``)."""
    first = run_block(commands, cwd)
    assert [r.returncode for r in first] == [0, 1], first[0].stderr[-3000:] + first[1].stderr
    second = run_block(commands, cwd)
    triage_argv = commands[-1]
    assert triage_argv[1] == "triage", triage_argv
    return second, cwd / triage_argv[2]


def test_a_nan_at_step_5_is_caught_dumped_at_step_6_only_and_named(workdir: Path) -> None:
    (demo, triage), save_path = run_twice(demo_block("nan@5"), workdir)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert save_path.is_symlink() and len(list(save_path.parent.iterdir())) == 3  # two runs and latest
    first = anomalies(save_path)[0]
    assert (first["step"], first["stage"], first["rule"], first["value"]) == (5, "actor_update", "non_finite", "nan")
    assert {a["metric"] for a in anomalies(save_path) if a["step"] == 5} >= {"actor/grad_norm"}
    assert dumped_steps(save_path) == ["step_6"]
    assert triage.returncode == 1, triage.stderr
    lines = dict(line.split(None, 1) for line in triage.stdout.splitlines() if line and not line[0].isspace())
    assert lines["module"].startswith("blocks.1.mlp.0 ")
    assert lines["param"].strip() == "blocks.1.mlp.0.weight"
    assert re.match(r".*verl_events/apps/demo/model\.py:\d+ in forward: .*self\.mlp\(", lines["source"])


def test_a_spike_at_step_5_is_caught_and_triage_compares_with_the_healthy_step(workdir: Path) -> None:
    (demo, triage), save_path = run_twice(demo_block("spike@5"), workdir)
    assert demo.returncode == 0, demo.stderr[-3000:]
    first = anomalies(save_path)[0]
    assert (first["step"], first["metric"], first["rule"]) == (5, "actor/grad_norm", "spike")
    assert dumped_steps(save_path) == ["step_2", "step_6"]
    assert triage.returncode == 1, triage.stderr
    lines = dict(line.split(None, 1) for line in triage.stdout.splitlines() if line and not line[0].isspace())
    assert lines["dumps"].startswith("healthy ") and "/step_2/" in lines["dumps"] and "/step_6/" in lines["dumps"]
    assert lines["module"].startswith("blocks.1.mlp.0 ")
    assert lines["param"].startswith("blocks.1.mlp.0.weight (moved x")
