"""``verl-events report RUN``: what profiling cost, per stage and step, from a run's timing logs.

* :mod:`.command`: the command (its arguments, output and exit codes);
* :mod:`.summary`: the report (:func:`report`), and its JSON form;
* :mod:`.steps`: the stages by step; :mod:`.render`: the tables on a console;
* :mod:`.raised`: the stages that raised, counted and kept out of the figures;
* :mod:`.overhead`: the timing logs read back (:func:`read_timing_records`)
  and the overhead table's medians;
* :mod:`.grouping`: the records by (stage, step), in one pass;
* :mod:`.stragglers`: which ranks are slow in a stage across the steps;
* :mod:`.headline`: the report's first line, the run in one sentence;
* :mod:`.plot`: ``--plot``, the overhead table as a figure;
* :mod:`.trace`: ``--trace``, the stages as a Chrome/Perfetto trace;
* :mod:`.memory`: the memory table and its leak flag, from the memory
  observer's logs; :mod:`.memory_plot`: ``--memory-plot``, the same over
  the steps as a figure.

Everything here reads the timing observer's logs, through their owner
(:mod:`verl_events.observers.timing`), the memory observer's through
theirs, and of msprobe's sessions only the marks of those cut short.
"""

from .command import add_command, command
from .render import render_overhead
from .summary import ReportError, report

__all__ = ["ReportError", "add_command", "command", "render_overhead", "report"]
