"""``verl-events compare A B``: where do two dumps first diverge?

A and B are run directories (our ``{save_path}``), stage directories, rank
directories or msprobe dump files; ``--step/--stage/--rank`` (and
``--vs-step/--vs-rank`` for the other side) pick the dump by our layout
(:mod:`.pick`).  Below a stage directory the layout is msprobe's
(:mod:`verl_events.observers.msprobe.layout`).  msprobe's own compare runs
through its Python API, by way of the one adapter that touches msprobe
(:func:`verl_events.observers.msprobe.msprobe_compare`); the raw statistics
in its table (:mod:`.table`) are then judged, in execution order, with
explicit tolerances (:mod:`.tolerance`; msprobe's relative errors are not
used: they are infinite whenever B's statistic is exactly 0, and no
tolerance could loosen that):

* a tensor diverges when its max, min, mean or norm is not close on the two
  sides, close meaning ``|a - b| <= atol * magnitude + rtol * |b|`` as in
  ``numpy.isclose``, with ``atol`` a fraction of the tensor's largest
  |value| (see :class:`Tolerance`; NaN and +/-Inf are close only to
  themselves), or when the dtypes differ;
* an entry present on one side only is *unmatched*, never "pass" (msprobe
  marks such rows "pass").

The worst list ranks rows by a scale-aware distance (:mod:`.distance`): a
statistic near zero, far below the scale of the op it belongs to, is
measured against a tenth of that scale, so rounding noise there ranks low;
each row names the module it ran in, from msprobe's construct.json
(:mod:`.modules`).  :mod:`.comparison` puts them together and writes the
verdict; :mod:`.render` prints it.  Exit codes
for scripts and CI: 0 no divergence, 1 diverged, 2 bad input.

Importing this package imports no observer and no tool: the CLI imports it
to build its parser.
"""

from .comparison import Comparison, compare_dumps, compare_rows, summary, write_csv
from .distance import NEAR_ZERO, scaled_distance
from .modules import module_of
from .pick import CompareInputError, Pick, dump_entries, resolve_dump
from .render import print_comparison
from .table import STATS, Row, op_name, rows_from_msprobe_csv, run_msprobe_compare
from .tolerance import DEFAULT_TOLERANCES, Tolerance, judge, magnitude, over_tolerance, resolve_tolerances

__all__ = [
    "DEFAULT_TOLERANCES",
    "NEAR_ZERO",
    "STATS",
    "CompareInputError",
    "Comparison",
    "Pick",
    "Row",
    "Tolerance",
    "compare_dumps",
    "compare_rows",
    "dump_entries",
    "judge",
    "magnitude",
    "module_of",
    "op_name",
    "over_tolerance",
    "print_comparison",
    "resolve_dump",
    "resolve_tolerances",
    "rows_from_msprobe_csv",
    "run_msprobe_compare",
    "scaled_distance",
    "summary",
    "write_csv",
]
