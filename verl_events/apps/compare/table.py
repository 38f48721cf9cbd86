"""msprobe's compare table, read: one :class:`Row` per entry, with both sides' statistics.

msprobe's own compare runs through its Python API, by way of the one adapter
that touches msprobe (:func:`verl_events.observers.msprobe.msprobe_compare`);
only the raw statistics of its CSV table are read here, never its verdicts.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .pick import CompareInputError

__all__ = ["STATS", "Row", "entry_parts", "op_name", "rows_from_msprobe_csv", "run_msprobe_compare"]

STATS = ("max", "min", "mean", "norm")

_CSV_NPU = {"max": "NPU max", "min": "NPU min", "mean": "NPU mean", "norm": "NPU l2norm"}
_CSV_BENCH = {"max": "Bench max", "min": "Bench min", "mean": "Bench mean", "norm": "Bench l2norm"}
_CSV_COLUMNS = ("NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", *_CSV_NPU.values(), *_CSV_BENCH.values())
_CSV_SHAPES = ("NPU Tensor Shape", "Bench Tensor Shape")  # read where present; the ranking does without
_OP_END = re.compile(r"\.(forward|backward|parameters_grad)(\.|$)")
#: A row's name: the dump.json entry it belongs to, then the tensor's place in it.
_ENTRY = re.compile(
    r"^(?P<key>Module\..+\.(?:forward|backward|parameters_grad)\.\d+|.+?\.(?:forward|backward))(?:\.(?P<part>.+))?$"
)


def _cell_number(text: str | None) -> float | None:
    """A statistic's cell of msprobe's table; None where it is empty, N/A or not a number."""
    if text is None:
        return None
    text = text.strip()
    if text in ("", "N/A", "None"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _cell_size(text: str | None) -> int | None:
    """A shape cell, ``[16, 23]``, as its element count (1 for ``[]``, a
    scalar); None where it is empty, N/A or not a shape."""
    text = (text or "").strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        return math.prod(int(n) for n in text[1:-1].split(",") if n.strip())
    except ValueError:
        return None


def op_name(entry: str) -> str:
    """``Functional.linear.3.forward.output.0`` -> ``Functional.linear.3.forward``."""
    match = _OP_END.search(entry)
    return entry[: match.end(1)] if match else entry


def entry_parts(entry: str) -> tuple[str, str]:
    """A row's name split into the dump.json entry it belongs to and the
    tensor's place there: ``Functional.linear.3.forward.input.1`` ->
    (``Functional.linear.3.forward``, ``input.1``),
    ``Module.fc1.Linear.forward.0.parameters.weight`` ->
    (``Module.fc1.Linear.forward.0``, ``parameters.weight``); a name of
    neither form is its own entry, with no place."""
    match = _ENTRY.match(entry)
    return (match["key"], match["part"] or "") if match else (entry, "")


@dataclass(slots=True)
class Row:
    """One entry of the table: its statistics on both sides (``None`` where
    msprobe has none) and element counts, the module it ran in (filled in by
    :func:`compare_dumps`), then our verdict and the worst list's distance,
    which :func:`compare_rows` fills in."""

    entry: str
    matched: bool
    side: str = ""  # "A" or "B" for unmatched entries
    dtypes: tuple[str, str] = ("", "")
    a_stats: dict[str, float | None] = field(default_factory=dict)
    b_stats: dict[str, float | None] = field(default_factory=dict)
    sizes: tuple[int | None, int | None] = (None, None)  # element counts, from the shapes
    module: str | None = None  # the module it ran in, "blocks.1.mlp.0" (construct.json; None at L1)
    problem: str = ""
    over: dict[str, float] = field(default_factory=dict)  # see over_tolerance
    scale: float = 0.0  # see distance.op_scales
    distances: dict[str, float] = field(default_factory=dict)  # see distance.scaled_distance

    @property
    def op(self) -> str:
        return op_name(self.entry)

    @property
    def worst(self) -> float:
        """The largest |a - b| over its tolerance among the statistics."""
        return max(self.over.values(), default=0.0)

    @property
    def distance(self) -> float:
        """The largest scale-aware distance among the statistics (what
        :meth:`Comparison.worst` ranks by); never above :attr:`worst`."""
        return max(self.distances.values(), default=0.0)


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
                sizes=(_cell_size(raw.get(_CSV_SHAPES[0])), _cell_size(raw.get(_CSV_SHAPES[1]))),
                a_stats={stat: _cell_number(raw[column]) for stat, column in _CSV_NPU.items()},
                b_stats={stat: _cell_number(raw[column]) for stat, column in _CSV_BENCH.items()},
            )
            for raw in reader
        ]


def run_msprobe_compare(a: Path, b: Path, out_dir: Path) -> Path:
    """msprobe's compare of two dump.json files, run in ``out_dir``; returns
    its CSV table.  CompareInputError when msprobe is missing, lacks its
    compare, fails or writes no table."""
    # Imported here for the parser's sake, under two names for mypy's: see pick.resolve_dump.
    from verl_events.observers.msprobe import msprobe_compare

    try:
        return msprobe_compare(a, b, out_dir)
    except RuntimeError as exc:  # ObserverSetupError included: msprobe lacks its compare
        raise CompareInputError(str(exc)) from exc
