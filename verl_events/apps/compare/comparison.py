"""The whole comparison of two dumps: the judged rows, and what is written of them.

:func:`compare_dumps` runs msprobe's compare on two dump files
(:mod:`.table`), judges each row under the tolerances (:mod:`.tolerance`),
measures its scale-aware distance for the worst list (:mod:`.distance`),
names the module it ran in (:mod:`.modules`) and adds the entries only B
has; :func:`summary` and :func:`write_csv` are the command's ``--json`` and
``--csv`` outputs.
"""

from __future__ import annotations

import csv
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verl_events.observers.msprobe import layout

from .distance import op_scales, scaled_distance
from .modules import module_of
from .pick import dump_entries
from .table import STATS, Row, op_name, rows_from_msprobe_csv, run_msprobe_compare
from .tolerance import DEFAULT_TOLERANCES, Tolerance, judge, over_tolerance

__all__ = ["Comparison", "compare_dumps", "compare_rows", "summary", "write_csv"]


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
        """The ``n`` matched rows furthest from their tolerance by the
        scale-aware :attr:`Row.distance` (:mod:`.distance`), not by
        :attr:`Row.worst`, which rounding noise in a statistic near zero
        inflates; ties keep execution order."""
        return sorted((r for r in self.rows if r.matched), key=lambda r: r.distance, reverse=True)[:n]


def compare_rows(a: Path, b: Path, rows: list[Row], tolerances: Mapping[str, Tolerance] | None = None) -> Comparison:
    """Judge ``rows``, in execution order (filling in each one's ``problem``
    and ``over``, then its ``scale`` and ``distances`` for the ranking) under
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
    op_scales(rows)
    for row in rows:
        row.distances = scaled_distance(row, resolved)
    return Comparison(a, b, rows, resolved)


def compare_dumps(a: Path, b: Path, tolerances: Mapping[str, Tolerance] | None = None) -> Comparison:
    """Compare two dump.json files; rows come in A's execution order, then
    entries only B has, each with the module it ran in by A's construct.json
    (B's for an entry A lacks).  ``tolerances`` as for :func:`compare_rows`."""
    a_entries, b_entries = dump_entries(a), dump_entries(b)
    with tempfile.TemporaryDirectory(prefix="verl_events_compare_") as scratch:
        rows = rows_from_msprobe_csv(run_msprobe_compare(a, b, Path(scratch)))
    # msprobe lists A's tensors; an entry only B has never appears in its table.
    a_ops = {op_name(name) for name in a_entries}
    rows += [Row(entry=name, matched=False, side="B") for name in b_entries if op_name(name) not in a_ops]
    constructs = (layout.read_construct(a), layout.read_construct(b))
    for row in rows:
        row.module = module_of(row.entry, *constructs)
    return compare_rows(a, b, rows, tolerances)


def write_csv(comparison: Comparison, path: Path) -> None:
    """Every row, with our verdict next to the statistics: ``module`` the
    module it ran in (empty where construct.json names none),
    ``<stat>_over_tol`` |a - b| over that statistic's tolerance (see
    :func:`over_tolerance`), ``distance`` the largest scale-aware distance
    the worst list ranks by and ``scale`` the scale it measured against (see
    :mod:`.distance`)."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["index", "entry", "op", "module", "matched", "dtype_a", "dtype_b"]
            + [f"{s}_over_tol" for s in STATS]
            + ["distance", "scale"]
            + [f"{s}_a" for s in STATS]
            + [f"{s}_b" for s in STATS]
            + ["verdict", "reason"]
        )
        for index, row in enumerate(comparison.rows):
            writer.writerow(
                [index, row.entry, row.op, row.module or "", row.matched, *row.dtypes]
                + [row.over.get(s) for s in STATS]
                + ([row.distance, row.scale] if row.matched else [None, None])
                + [row.a_stats.get(s) for s in STATS]
                + [row.b_stats.get(s) for s in STATS]
                + ["diverged" if row.problem else "ok", row.problem]
            )


def summary(comparison: Comparison, top: int) -> dict[str, Any]:
    """The verdict as plain data (the ``--json`` output).  The first divergence
    and each ``worst`` row name their ``module`` (None where construct.json
    names none, as at level L1).  ``worst`` lists the ``top`` rows of
    :meth:`Comparison.worst`, in its order, with ``distance`` (what they are
    ranked by, :mod:`.distance`), the ``scale`` it measured against and
    ``over_tol``, their largest |a - b| over its tolerance (inf where nothing
    was allowed; the distance is never larger)."""
    first = comparison.problems[0] if comparison.problems else None
    return {
        "a": str(comparison.a),
        "b": str(comparison.b),
        "verdict": "diverged" if comparison.diverged else "match",
        "tolerances": {stat: asdict(tolerance) for stat, tolerance in comparison.tolerances.items()},
        "counts": comparison.counts(),
        "first_divergence": None
        if first is None
        else {"op": first.op, "module": first.module, "entry": first.entry, "reason": first.problem},
        "worst": [
            {
                "entry": r.entry,
                "module": r.module,
                "distance": r.distance,
                "scale": r.scale,
                "over_tol": r.worst,
                "reason": r.problem,
            }
            for r in comparison.worst(top)
        ],
    }
