"""``verl-events compare A B``: where do two dumps first diverge?

A and B are run directories (our ``{save_path}``), stage directories, rank
directories or ``dump.json`` files; ``--step/--stage/--rank`` (and
``--vs-step/--vs-rank`` for the other side) pick the dump by our layout.
msprobe's own compare runs through its Python API; its table is then
judged here, in execution order, with explicit tolerances:

* a tensor diverges when the relative error of its max, min, mean or norm
  exceeds the tolerance for that statistic, when only one side is
  NaN/Inf, or when the dtypes differ;
* an entry present on one side only is *unmatched*, never "pass" (msprobe
  marks such rows "pass").

Exit codes for scripts and CI: 0 no divergence, 1 diverged, 2 bad input.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATS = ("max", "min", "mean", "norm")
#: Default relative tolerances.  Mean is loosest: a near-zero mean makes its
#: relative error explode on harmless noise.  Norm is the most telling.
DEFAULT_RTOL = {"max": 0.01, "min": 0.01, "mean": 0.1, "norm": 0.001}

_CSV_REL = {"max": "MaxRelativeErr", "min": "MinRelativeErr", "mean": "MeanRelativeErr", "norm": "NormRelativeErr"}
_CSV_NPU = {"max": "NPU max", "min": "NPU min", "mean": "NPU mean", "norm": "NPU l2norm"}
_CSV_BENCH = {"max": "Bench max", "min": "Bench min", "mean": "Bench mean", "norm": "Bench l2norm"}
_OP_END = re.compile(r"\.(forward|backward|parameters_grad)(\.|$)")


class CompareInputError(ValueError):
    """A dump cannot be found or read; the message says which and why (exit 2)."""


# -- finding the dumps ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pick:
    """Which dump to take from a run directory."""

    step: int | None = None
    stage: str | None = None
    rank: int = 0
    call: int = 0


def resolve_dump(path: Path, pick: Pick) -> Path:
    """The ``dump.json`` that ``path`` and ``pick`` designate, or CompareInputError."""
    if path.is_file():
        if path.name != "dump.json":
            raise CompareInputError(f"{path} is not an msprobe dump.json")
        return path
    if not path.is_dir():
        raise CompareInputError(f"{path} does not exist")
    if (path / "dump.json").is_file():
        return path / "dump.json"
    if any(path.glob("step_*")):  # a run directory
        if pick.step is None or pick.stage is None:
            steps = sorted({p.name for p in path.glob("step_*")})
            stages = sorted({p.name for p in path.glob("step_*/*") if p.is_dir()})
            raise CompareInputError(
                f"{path} is a run directory; choose a dump with --step and --stage "
                f"(steps here: {', '.join(steps)}; stages: {', '.join(stages)})"
            )
        stage_dir = path / f"step_{pick.step}" / pick.stage
        if not stage_dir.is_dir():
            raise CompareInputError(f"{stage_dir} does not exist: step {pick.step} of stage {pick.stage!r} was not dumped")
        path = stage_dir
    if any(path.glob("step*/rank*")) or any(path.glob("step*/proc*")):  # a stage directory
        path = path / f"step{pick.call}"
    if any(path.glob("rank*")):  # msprobe's step directory
        rank_dir = path / f"rank{pick.rank}"
        if not rank_dir.is_dir():
            ranks = sorted(p.name for p in path.glob("rank*"))
            raise CompareInputError(f"{rank_dir} does not exist; ranks here: {', '.join(ranks)}")
        path = rank_dir
    elif procs := sorted(path.glob("proc*")):
        raise CompareInputError(
            f"{path} holds msprobe {', '.join(p.name for p in procs)} dumps, written without a rank; "
            f"pass the dump.json itself, e.g. {procs[0] / 'dump.json'}"
        )
    dump = path / "dump.json"
    if not dump.is_file():
        raise CompareInputError(
            f"{path} has no dump.json: the stage was not dumped here, or the run stopped before msprobe "
            "wrote it (msprobe writes dump.json when a session stops)"
        )
    return dump


def read_dump(path: Path) -> dict[str, Any]:
    """The ``data`` of a dump.json.  msprobe writes bare NaN/Infinity, which
    Python's json reads."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CompareInputError(f"{path} is not a readable msprobe dump.json: {exc}") from exc
    if not isinstance(data, dict):
        raise CompareInputError(f"{path}: its 'data' is not a mapping of API/module entries")
    return data


# -- judging msprobe's table -----------------------------------------------------


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    text = text.strip()
    if text in ("", "N/A", "None"):
        return None
    scale = 0.01 if text.endswith("%") else 1.0
    try:
        return float(text.rstrip("%")) * scale
    except ValueError:
        return None


def op_name(entry: str) -> str:
    """``Functional.linear.3.forward.output.0`` -> ``Functional.linear.3.forward``."""
    match = _OP_END.search(entry)
    return entry[: match.end(1)] if match else entry


@dataclass(slots=True)
class Row:
    entry: str
    matched: bool
    side: str = ""  # "A" or "B" for unmatched entries
    dtypes: tuple[str, str] = ("", "")
    rel: dict[str, float | None] = field(default_factory=dict)
    a_stats: dict[str, float | None] = field(default_factory=dict)
    b_stats: dict[str, float | None] = field(default_factory=dict)
    problem: str = ""

    @property
    def op(self) -> str:
        return op_name(self.entry)

    @property
    def worst(self) -> float:
        values = [v for v in self.rel.values() if v is not None and not math.isnan(v)]
        return max(values, default=0.0)


def judge(row: Row, rtol: dict[str, float]) -> str:
    """Why ``row`` diverges, or "" when it does not."""
    if not row.matched:
        return f"only in {row.side}"
    a_dtype, b_dtype = row.dtypes
    if a_dtype not in ("", "N/A") and b_dtype not in ("", "N/A") and a_dtype != b_dtype:
        return f"dtype {a_dtype} vs {b_dtype}"
    for stat in STATS:
        a, b = row.a_stats.get(stat), row.b_stats.get(stat)
        if a is not None and b is not None and math.isfinite(a) != math.isfinite(b):
            return f"{stat} is {a} in A but {b} in B"
    over = [
        f"{stat} relative error {value:.3%} > {rtol[stat]:.3%}"
        for stat in STATS
        if (value := row.rel.get(stat)) is not None and not math.isnan(value) and value > rtol[stat]
    ]
    return ", ".join(over)


def rows_from_msprobe_csv(path: Path) -> list[Row]:
    rows = []
    with path.open(encoding="utf-8", newline="") as handle:
        for raw in csv.DictReader(handle):
            bench = raw.get("Bench Name", "N/A")
            rows.append(
                Row(
                    entry=raw["NPU Name"],
                    matched=bench not in ("N/A", "", None),
                    side="A",
                    dtypes=(raw.get("NPU Dtype", ""), raw.get("Bench Dtype", "")),
                    rel={stat: _number(raw.get(column)) for stat, column in _CSV_REL.items()},
                    a_stats={stat: _number(raw.get(column)) for stat, column in _CSV_NPU.items()},
                    b_stats={stat: _number(raw.get(column)) for stat, column in _CSV_BENCH.items()},
                )
            )
    return rows


def run_msprobe_compare(a: Path, b: Path, out_dir: Path) -> Path:
    """msprobe's compare of two dump.json files; returns its CSV."""
    from msprobe.pytorch.compare.pt_compare import pt_compare

    chatter = io.StringIO()  # msprobe prints and draws tqdm bars; keep them for errors only
    try:
        # msprobe's own pandas deprecation warnings are not the user's to fix.
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pt_compare({"npu_path": str(a), "bench_path": str(b), "is_print_compare_log": False}, str(out_dir))
    except Exception as exc:
        raise CompareInputError(f"msprobe compare of {a} and {b} failed: {type(exc).__name__}: {exc}\n{chatter.getvalue()[-2000:]}") from exc
    produced = sorted(out_dir.glob("compare_result*.csv"), key=lambda p: p.stat().st_mtime)
    if not produced:
        raise CompareInputError(f"msprobe compare of {a} and {b} wrote no table: {chatter.getvalue()[-2000:]}")
    return produced[-1]


# -- the whole comparison --------------------------------------------------------


@dataclass(slots=True)
class Comparison:
    a: Path
    b: Path
    rows: list[Row]
    rtol: dict[str, float]

    @property
    def problems(self) -> list[Row]:
        return [row for row in self.rows if row.problem]

    @property
    def diverged(self) -> bool:
        return bool(self.problems)

    def counts(self) -> dict[str, int]:
        matched = [r for r in self.rows if r.matched]
        return {
            "entries": len(self.rows),
            "matched": len(matched),
            "unmatched": len(self.rows) - len(matched),
            "diverged": sum(1 for r in matched if r.problem and not r.problem.startswith("dtype")),
            "dtype_mismatches": sum(1 for r in matched if r.problem.startswith("dtype")),
        }

    def worst(self, n: int) -> list[Row]:
        return sorted((r for r in self.rows if r.matched), key=lambda r: r.worst, reverse=True)[:n]


def compare_dumps(a: Path, b: Path, rtol: dict[str, float] | None = None) -> Comparison:
    """Compare two dump.json files; rows come in A's execution order, then
    entries only B has."""
    tolerances = {**DEFAULT_RTOL, **(rtol or {})}
    a_entries, b_entries = read_dump(a), read_dump(b)
    with tempfile.TemporaryDirectory(prefix="verl_events_compare_") as scratch:
        rows = rows_from_msprobe_csv(run_msprobe_compare(a, b, Path(scratch)))
    # msprobe lists A's tensors; an entry only B has never appears in its table.
    a_ops = {op_name(name) for name in a_entries}
    rows += [Row(entry=name, matched=False, side="B") for name in b_entries if op_name(name) not in a_ops]
    for row in rows:
        row.problem = judge(row, tolerances)
    return Comparison(a, b, rows, tolerances)


def write_csv(comparison: Comparison, path: Path) -> None:
    """Every row, with our verdict next to the statistics."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["index", "entry", "op", "matched", "dtype_a", "dtype_b"]
            + [f"{s}_rel_err" for s in STATS] + [f"{s}_a" for s in STATS] + [f"{s}_b" for s in STATS]
            + ["verdict", "reason"]
        )
        for index, row in enumerate(comparison.rows):
            writer.writerow(
                [index, row.entry, row.op, row.matched, *row.dtypes]
                + [row.rel.get(s) for s in STATS] + [row.a_stats.get(s) for s in STATS] + [row.b_stats.get(s) for s in STATS]
                + ["diverged" if row.problem else "ok", row.problem]
            )


def summary(comparison: Comparison, top: int) -> dict[str, Any]:
    first = comparison.problems[0] if comparison.problems else None
    return {
        "a": str(comparison.a),
        "b": str(comparison.b),
        "verdict": "diverged" if comparison.diverged else "match",
        "tolerances": comparison.rtol,
        "counts": comparison.counts(),
        "first_divergence": None if first is None else {"op": first.op, "entry": first.entry, "reason": first.problem},
        "worst": [{"entry": r.entry, "worst_rel_err": r.worst, "reason": r.problem} for r in comparison.worst(top)],
    }
