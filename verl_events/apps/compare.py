"""``verl-events compare A B``: where do two dumps first diverge?

A and B are run directories (our ``{save_path}``), stage directories, rank
directories or ``dump.json`` files; ``--step/--stage/--rank`` (and
``--vs-step/--vs-rank`` for the other side) pick the dump by our layout.
Below a stage directory the layout is msprobe's
(:mod:`verl_events.observers.msprobe_layout`).  msprobe's own compare runs
through its Python API, by way of the one adapter that touches msprobe
(:func:`verl_events.observers.msprobe.msprobe_compare`); the raw statistics
in its table are then judged here, in execution order, with explicit
tolerances (msprobe's relative errors are not used: they are infinite
whenever B's statistic is exactly 0, and no tolerance could loosen that):

* a tensor diverges when its max, min, mean or norm is not close on the two
  sides, close meaning ``|a - b| <= atol * magnitude + rtol * |b|`` as in
  ``numpy.isclose``, with ``atol`` a fraction of the tensor's largest
  |value| (see :class:`Tolerance`; NaN and +/-Inf are close only to
  themselves), or when the dtypes differ;
* an entry present on one side only is *unmatched*, never "pass" (msprobe
  marks such rows "pass").

Exit codes for scripts and CI: 0 no divergence, 1 diverged, 2 bad input.
"""

from __future__ import annotations

import csv
import json
import math
import re
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from verl_events.layout import incomplete_reason

STATS = ("max", "min", "mean", "norm")

_CSV_NPU = {"max": "NPU max", "min": "NPU min", "mean": "NPU mean", "norm": "NPU l2norm"}
_CSV_BENCH = {"max": "Bench max", "min": "Bench min", "mean": "Bench mean", "norm": "Bench l2norm"}
_CSV_COLUMNS = ("NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", *_CSV_NPU.values(), *_CSV_BENCH.values())
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
    """The ``dump.json`` that ``path`` and ``pick`` designate, or CompareInputError.

    Below a stage directory the layout is msprobe's, as
    :mod:`verl_events.observers.msprobe_layout` describes it."""
    # Imported here, not at the top: the CLI imports this module to build its
    # parser, which needs no observer.  mypy checks the repository's observers/
    # folder as the package "observers" ([tool.mypy] in pyproject.toml) and
    # cannot follow its installed name, verl_events.observers.
    if TYPE_CHECKING:
        from observers import msprobe_layout as layout
    else:
        from verl_events.observers import msprobe_layout as layout

    if path.is_file():
        if path.name != layout.DUMP_FILE:
            raise CompareInputError(f"{path} is not an msprobe {layout.DUMP_FILE}")
        path = path.parent
    if not path.is_dir():
        raise CompareInputError(f"{path} does not exist")
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
            raise CompareInputError(
                f"{stage_dir} does not exist: step {pick.step} of stage {pick.stage!r} was not dumped"
            )
        path = stage_dir
    if layout.holds_sessions(path):  # a stage directory: msprobe's dump_path
        path = layout.step_dir(path, pick.call)
    if ranks := layout.rank_dirs(path):  # msprobe's step directory
        rank_dir = layout.rank_dir(path, pick.rank)
        if not rank_dir.is_dir():
            raise CompareInputError(f"{rank_dir} does not exist; ranks here: {', '.join(p.name for p in ranks)}")
        path = rank_dir
    elif procs := layout.proc_dirs(path):
        raise CompareInputError(
            f"{path} holds msprobe {', '.join(p.name for p in procs)} dumps, written without a rank; "
            f"pass the {layout.DUMP_FILE} itself, e.g. {layout.dump_file(procs[0])}"
        )
    dump = layout.dump_file(path)
    reason = incomplete_reason(path)
    if reason is not None:
        raise CompareInputError(
            f"{path} is an incomplete msprobe session, not a whole stage: {reason}; "
            "compare needs two whole stages (dump this step again)"
        )
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
    try:
        return float(text)
    except ValueError:
        return None


def op_name(entry: str) -> str:
    """``Functional.linear.3.forward.output.0`` -> ``Functional.linear.3.forward``."""
    match = _OP_END.search(entry)
    return entry[: match.end(1)] if match else entry


@dataclass(slots=True)
class Row:
    """One entry of the table: its statistics on both sides (``None`` where
    msprobe has none), then our verdict, which :func:`compare_rows` fills in."""

    entry: str
    matched: bool
    side: str = ""  # "A" or "B" for unmatched entries
    dtypes: tuple[str, str] = ("", "")
    a_stats: dict[str, float | None] = field(default_factory=dict)
    b_stats: dict[str, float | None] = field(default_factory=dict)
    problem: str = ""
    over: dict[str, float] = field(default_factory=dict)  # see over_tolerance

    @property
    def op(self) -> str:
        return op_name(self.entry)

    @property
    def worst(self) -> float:
        """The largest |a - b| over its tolerance among the statistics."""
        return max(self.over.values(), default=0.0)


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far one statistic may move: A's value ``a`` is close to B's ``b`` when

        |a - b| <= atol * magnitude + rtol * |b|

    where ``magnitude`` is the tensor's largest |value| on side B (see
    :func:`magnitude`).  ``atol`` is a fraction of that magnitude rather than
    an absolute number, so one setting fits activations and gradients a
    million times smaller.  NaN is close only to NaN, +Inf only to +Inf and
    -Inf only to -Inf, whatever the tolerance.  Both fields must be finite
    and >= 0, or ValueError."""

    rtol: float
    atol: float = 0.0

    def __post_init__(self) -> None:
        for kind in ("rtol", "atol"):
            value = getattr(self, kind)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"a tolerance's {kind} must be a finite number >= 0, got {value!r}")

    def allowed(self, b: float, magnitude: float) -> float:
        """The largest |a - b| still close to ``b``."""
        return self.atol * magnitude + self.rtol * abs(b)


#: The default tolerances, the one source for compare, its CLI flags and the
#: docs.  Norm is the most telling statistic, so the tightest.  The mean of a
#: tensor centred on zero is cancellation noise of the order of its values'
#: magnitude, so it gets an atol of 1e-3 of that magnitude: a layer norm's
#: mean of 1e-9 in one run and exactly 0.0 in the other is no divergence,
#: while a shift of the whole tensor by 0.1 % of its largest value is.
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = MappingProxyType(
    {
        "max": Tolerance(rtol=0.01),
        "min": Tolerance(rtol=0.01),
        "mean": Tolerance(rtol=0.01, atol=0.001),
        "norm": Tolerance(rtol=0.001),
    }
)


def resolve_tolerances(
    rtol: Mapping[str, float | None] | None = None, atol: Mapping[str, float | None] | None = None
) -> dict[str, Tolerance]:
    """:data:`DEFAULT_TOLERANCES` with the given per-statistic overrides (a
    ``None`` value keeps the default).  Raises ValueError, naming the statistic
    and the value, for a statistic not in :data:`STATS` or a value that is not
    a finite number >= 0."""
    resolved = dict(DEFAULT_TOLERANCES)
    for kind, overrides in (("rtol", rtol or {}), ("atol", atol or {})):
        for stat, value in overrides.items():
            if stat not in resolved:
                raise ValueError(
                    f"compare has no statistic {stat!r} to give an {kind}; the statistics are {', '.join(STATS)}"
                )
            if value is None:
                continue
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"the {kind} of {stat} must be a finite number >= 0, got {value!r}")
            resolved[stat] = replace(resolved[stat], **{kind: value})
    return resolved


def magnitude(stats: Mapping[str, float | None]) -> float:
    """The tensor's largest |value|: max(|max|, |min|) over those that are
    known and finite, 0.0 when neither is."""
    return max((abs(v) for s in ("max", "min") if (v := stats.get(s)) is not None and math.isfinite(v)), default=0.0)


def _close(a: float, b: float, tolerance: Tolerance, scale: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tolerance.allowed(b, scale)


def _ratio(a: float, b: float, tolerance: Tolerance, scale: float) -> float:
    """|a - b| over its tolerance; 0.0 for equal values (NaN and NaN
    included), inf for a difference where nothing is allowed."""
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return 0.0 if _close(a, b, tolerance, scale) else math.inf
    diff, allowed = abs(a - b), tolerance.allowed(b, scale)
    if diff == 0.0:
        return 0.0
    return diff / allowed if allowed > 0.0 else math.inf


def _both(row: Row) -> list[tuple[str, float, float]]:
    """The statistics both sides have (msprobe writes N/A for non-tensors and
    no mean or norm for integer tensors)."""
    return [(s, a, b) for s in STATS if (a := row.a_stats.get(s)) is not None and (b := row.b_stats.get(s)) is not None]


def judge(row: Row, tolerances: Mapping[str, Tolerance]) -> str:
    """Why ``row`` diverges, or "" when it does not: an entry on one side
    only, a dtype mismatch, or each statistic not close under ``tolerances`` (one per
    name in :data:`STATS`), as :class:`Tolerance` defines close.  A statistic
    missing on either side is not judged."""
    if not row.matched:
        return f"only in {row.side}"
    a_dtype, b_dtype = row.dtypes
    if a_dtype not in ("", "N/A") and b_dtype not in ("", "N/A") and a_dtype != b_dtype:
        return f"dtype {a_dtype} vs {b_dtype}"
    scale = magnitude(row.b_stats)
    reasons = []
    for stat, a, b in _both(row):
        tolerance = tolerances[stat]
        if _close(a, b, tolerance, scale):
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            reasons.append(f"{stat} is {a} in A but {b} in B")
            continue
        diff, allowed = abs(a - b), tolerance.allowed(b, scale)
        reasons.append(
            f"{stat} {a:.6g} in A vs {b:.6g} in B: off by {diff:.3g}"
            + (f", {diff / allowed:.3g}x its tolerance {allowed:.3g}" if allowed > 0 else ", where its tolerance is 0")
        )
    return "; ".join(reasons)


def over_tolerance(row: Row, tolerances: Mapping[str, Tolerance]) -> dict[str, float]:
    """For each statistic both sides of a matched ``row`` have: |a - b| over
    its tolerance.  Above 1 is a divergence; 0.0 means equal; inf means a
    NaN/Inf on one side only, or a difference where the tolerance is 0.  An
    unmatched row has none."""
    if not row.matched:
        return {}
    scale = magnitude(row.b_stats)
    return {stat: _ratio(a, b, tolerances[stat], scale) for stat, a, b in _both(row)}


def rows_from_msprobe_csv(path: Path) -> list[Row]:
    """The rows of msprobe's compare table at ``path``, in its order.

    CompareInputError when the table lacks a column read here.  msprobe
    writes the max/min/mean/l2norm columns for statistics and tensor dumps
    only; a table of md5 dumps (``summary_mode: md5``) has none, and
    compare, which judges those statistics, would otherwise call every
    entry a match.  A cell left empty or N/A (a non-tensor, an integer
    tensor's mean) is a statistic msprobe does not have: ``None``."""
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []  # None for an empty file: then every column is missing
        if missing := [column for column in _CSV_COLUMNS if column not in header]:
            raise CompareInputError(
                f"msprobe's compare table {path} has no column {', '.join(map(repr, missing))}: compare judges "
                "the max, min, mean and norm statistics, which msprobe records in statistics and tensor dumps, "
                "not with summary_mode md5; dump both runs with summary_mode statistics"
            )
        return [
            Row(
                entry=raw["NPU Name"],
                matched=raw["Bench Name"] not in ("N/A", "", None),
                side="A",
                dtypes=(raw["NPU Dtype"] or "", raw["Bench Dtype"] or ""),
                a_stats={stat: _number(raw[column]) for stat, column in _CSV_NPU.items()},
                b_stats={stat: _number(raw[column]) for stat, column in _CSV_BENCH.items()},
            )
            for raw in reader
        ]


def run_msprobe_compare(a: Path, b: Path, out_dir: Path) -> Path:
    """msprobe's compare of two dump.json files, run in ``out_dir``; returns
    its CSV table.  CompareInputError when msprobe is missing, lacks its
    compare, fails or writes no table."""
    # Imported here for the parser's sake, under two names for mypy's: see resolve_dump.
    if TYPE_CHECKING:
        from observers.msprobe import msprobe_compare
    else:
        from verl_events.observers.msprobe import msprobe_compare

    try:
        return msprobe_compare(a, b, out_dir)
    except RuntimeError as exc:  # ObserverSetupError included: msprobe lacks its compare
        raise CompareInputError(str(exc)) from exc


# -- the whole comparison --------------------------------------------------------


@dataclass(slots=True)
class Comparison:
    a: Path
    b: Path
    rows: list[Row]
    tolerances: dict[str, Tolerance]

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
        """The ``n`` matched rows furthest past (or nearest to) their
        tolerance, by :attr:`Row.worst`; ties keep execution order."""
        return sorted((r for r in self.rows if r.matched), key=lambda r: r.worst, reverse=True)[:n]


def compare_rows(a: Path, b: Path, rows: list[Row], tolerances: Mapping[str, Tolerance] | None = None) -> Comparison:
    """Judge ``rows`` (filling in each one's ``problem`` and ``over``) under
    ``tolerances``, by default :data:`DEFAULT_TOLERANCES`; a mapping without
    every statistic raises ValueError."""
    resolved = dict(DEFAULT_TOLERANCES if tolerances is None else tolerances)
    if missing := [stat for stat in STATS if stat not in resolved]:
        raise ValueError(
            f"compare tolerances must cover {', '.join(STATS)}; {', '.join(missing)} missing "
            "(resolve_tolerances fills in defaults)"
        )
    for row in rows:
        row.problem = judge(row, resolved)
        row.over = over_tolerance(row, resolved)
    return Comparison(a, b, rows, resolved)


def compare_dumps(a: Path, b: Path, tolerances: Mapping[str, Tolerance] | None = None) -> Comparison:
    """Compare two dump.json files; rows come in A's execution order, then
    entries only B has.  ``tolerances`` as for :func:`compare_rows`."""
    a_entries, b_entries = read_dump(a), read_dump(b)
    with tempfile.TemporaryDirectory(prefix="verl_events_compare_") as scratch:
        rows = rows_from_msprobe_csv(run_msprobe_compare(a, b, Path(scratch)))
    # msprobe lists A's tensors; an entry only B has never appears in its table.
    a_ops = {op_name(name) for name in a_entries}
    rows += [Row(entry=name, matched=False, side="B") for name in b_entries if op_name(name) not in a_ops]
    return compare_rows(a, b, rows, tolerances)


def write_csv(comparison: Comparison, path: Path) -> None:
    """Every row, with our verdict next to the statistics: ``<stat>_over_tol``
    is |a - b| over that statistic's tolerance (see :func:`over_tolerance`)."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["index", "entry", "op", "matched", "dtype_a", "dtype_b"]
            + [f"{s}_over_tol" for s in STATS]
            + [f"{s}_a" for s in STATS]
            + [f"{s}_b" for s in STATS]
            + ["verdict", "reason"]
        )
        for index, row in enumerate(comparison.rows):
            writer.writerow(
                [index, row.entry, row.op, row.matched, *row.dtypes]
                + [row.over.get(s) for s in STATS]
                + [row.a_stats.get(s) for s in STATS]
                + [row.b_stats.get(s) for s in STATS]
                + ["diverged" if row.problem else "ok", row.problem]
            )


def summary(comparison: Comparison, top: int) -> dict[str, Any]:
    """The verdict as plain data (the ``--json`` output).  ``worst`` lists the
    ``top`` rows of :meth:`Comparison.worst` with ``over_tol``, their largest
    |a - b| over its tolerance (inf where nothing was allowed)."""
    first = comparison.problems[0] if comparison.problems else None
    return {
        "a": str(comparison.a),
        "b": str(comparison.b),
        "verdict": "diverged" if comparison.diverged else "match",
        "tolerances": {stat: asdict(tolerance) for stat, tolerance in comparison.tolerances.items()},
        "counts": comparison.counts(),
        "first_divergence": None if first is None else {"op": first.op, "entry": first.entry, "reason": first.problem},
        "worst": [{"entry": r.entry, "over_tol": r.worst, "reason": r.problem} for r in comparison.worst(top)],
    }
