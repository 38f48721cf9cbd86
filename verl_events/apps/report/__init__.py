"""``verl-events report RUN``: what profiling cost, per stage and step, from a run's timing logs.

* :mod:`.command`: the command (its arguments, output and exit codes);
* :mod:`.summary`: the report (:func:`report`): the stages by step, and the
  JSON form;
* :mod:`.overhead`: the timing logs read back (:func:`read_timing_records`)
  and the overhead table's medians;
* :mod:`.grouping`: the records by (stage, step), in one pass;
* :mod:`.stragglers`: which ranks are slow in a stage across the steps;
* :mod:`.trace`: ``--trace``, the stages as a Chrome/Perfetto trace.

Everything here reads the timing observer's logs, through their owner
(:mod:`verl_events.observers.timing`), and of msprobe's sessions only the
marks of those cut short.
"""

from .command import add_command, command
from .summary import ReportError, render_overhead, report

__all__ = ["ReportError", "add_command", "command", "render_overhead", "report"]
