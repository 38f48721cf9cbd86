"""docs/msprobe.md's section "msprobe's own tools on our dumps", run as written.

Every bash block of the section runs twice in a row (users run a command again), in a
fresh folder holding a copy of examples/ (the doc's commands are run from the repository
root: their relative paths are the same there), with the venv's ``verl-events``,
``msprobe`` and ``python`` first on PATH.  The first block makes the demo's dumps the
others read.  A block exits 0 unless it says ``# exits N``; a ``text`` block right under
a bash block quotes lines of its output (stdout and stderr together), which must be there
on every run, in any order; ``...`` stands for anything (a timestamp, an absolute path),
and a line that is only ``...`` for lines left out.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the demo trains with torch and dumps with msprobe
pytest.importorskip("msprobe")

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs/msprobe.md"
HEADING = "## msprobe's own tools on our dumps"
RUNS = 2
OUTPUTS = "outputs/msprobe-tools"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", flags=re.M | re.S)


@dataclass(frozen=True)
class Block:
    index: int
    script: str
    exits: int
    quoted: tuple[str, ...]  # the lines of the text block under it

    @property
    def id(self) -> str:
        """The block's number, command and output folder (or its third word)."""
        words = self.script.split()
        out = next((words[i + 1] for i, word in enumerate(words[:-1]) if word in ("-o", "--csv")), words[2])
        return "-".join([str(self.index), *words[:2], re.sub(r"[^A-Za-z0-9_.]+", "-", Path(out).name).strip("-")])

    def pattern(self, line: str) -> re.Pattern[str]:
        return re.compile(".*".join(re.escape(part) for part in line.strip().split("...")), flags=re.M)


def section(text: str) -> str:
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start:] if end < 0 else text[start:end]


def doc_blocks() -> list[Block]:
    text = section(DOC.read_text())
    fences = list(FENCE.finditer(text))
    blocks = []
    for i, fence in enumerate(fences):
        if fence.group(1) != "bash":
            continue
        quoted: tuple[str, ...] = ()
        following = fences[i + 1] if i + 1 < len(fences) else None
        if following is not None and following.group(1) == "text" and not text[fence.end() : following.start()].strip():
            quoted = tuple(line for line in following.group(2).splitlines() if line.strip() not in ("", "..."))
        exits = re.search(r"#\s*exits (\d+)", fence.group(2))
        blocks.append(Block(len(blocks), fence.group(2), int(exits.group(1)) if exits else 0, quoted))
    return blocks


BLOCKS = doc_blocks()


@dataclass(frozen=True)
class Ran:
    workdir: Path
    outputs: dict[int, list[subprocess.CompletedProcess[str]]]

    def path(self, relative: str) -> Path:
        return self.workdir / OUTPUTS / relative


def run_block(block: Block, workdir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.script],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """Every block of the section, in the doc's order, each run twice."""
    workdir = tmp_path_factory.mktemp("msprobe_tools")
    shutil.copytree(REPO / "examples", workdir / "examples")
    return Ran(workdir, {block.index: [run_block(block, workdir) for _ in range(RUNS)] for block in BLOCKS})


def test_the_section_shows_each_tool_and_the_guides_form() -> None:
    scripts = "\n".join(block.script for block in BLOCKS)
    assert BLOCKS[0].script.startswith(f"rm -rf {OUTPUTS}\n"), "the first block makes the dumps afresh"
    for command in ("msprobe compare -tp", "msprobe graph_visualize -tp", "msprobe overflow_check -i"):
        assert command in scripts
    assert "msprobe compare --target-path" in scripts  # verl's guide's form, which fails
    assert "verl-events compare" in scripts


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_each_block_runs_twice_as_the_doc_says(ran: Ran, block: Block) -> None:
    for attempt, result in enumerate(ran.outputs[block.index], start=1):
        output = result.stdout.replace("\r", "\n")
        where = f"run {attempt} of:\n{block.script}\noutput (end):\n{output[-4000:]}"
        assert result.returncode == block.exits, f"exit code {result.returncode}, not {block.exits}, {where}"
        for line in block.quoted:
            assert block.pattern(line).search(output), f"{line!r} is not in the output, {where}"


def test_each_tool_writes_a_new_file_per_run_where_the_doc_says(ran: Ran) -> None:
    written = {
        "compare-json": "compare_result_*.csv",
        "compare-step0": "compare_result_rank0_*.csv",
        "graph-build": "build_*.vis.db",
        "graph-compare": "compare_*.vis.db",
        "overflow": "anomaly_analyze_*.json",
    }
    for folder, pattern in written.items():
        made = sorted(p.name for p in ran.path(folder).iterdir())
        assert len(made) == RUNS and all(Path(name).match(pattern) for name in made), (folder, made)
    failed = ("compare-rank0", "compare-stage", "compare-step", "graph", "graph-l1", "graph-step", "graph-file")
    for folder in (*failed, "overflow-rank0"):  # overflow_check on a rank folder finds nothing, writes nothing
        assert not ran.path(folder).exists() or not any(ran.path(folder).iterdir()), folder


def test_overflow_check_names_the_module_of_the_nan(ran: Ran) -> None:
    for report in ran.path("overflow").glob("anomaly_analyze_*.json"):
        found = json.loads(report.read_text())
        assert [entry["op_name"] for entry in found["rank_0"]] == ["Module.blocks.1.mlp.0.Linear.forward.0"]


def test_the_graph_colours_the_op_that_read_the_50x_weight_as_pass(ran: Ran) -> None:
    database = next(ran.path("graph-compare").glob("compare_*.vis.db"))
    with closing(sqlite3.connect(database)) as db:
        rows = db.execute(
            "SELECT precision_index FROM tb_nodes WHERE node_name = 'Functional.linear.6.forward'"
            " AND precision_index IS NOT NULL"
        ).fetchall()
    assert rows == [(0,)]  # "pass", the lightest colour


def test_msprobe_passes_the_50x_weight_that_ours_flags(ran: Ran) -> None:
    """The verdicts the doc's table shows, read from the two CSVs without the doc's script."""
    [theirs_csv, *_] = sorted(ran.path("compare-json").glob("compare_result_*.csv"))
    with theirs_csv.open(newline="") as f:
        theirs = {row["NPU Name"]: row for row in csv.DictReader(f)}
    with ran.path("ours.csv").open(newline="") as f:
        ours = {row["entry"]: row for row in csv.DictReader(f)}
    for entry in ("Functional.linear.6.forward.input.1", "Functional.linear.6.forward.output.0"):
        assert theirs[entry]["Result"] == "pass"
        assert float(theirs[entry]["NormRelativeErr"].rstrip("%")) > 4000
        assert ours[entry]["verdict"] == "diverged"
        assert float(ours[entry]["norm_over_tol"]) > 10_000
