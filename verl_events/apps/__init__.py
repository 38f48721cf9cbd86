"""The tools built on the core: the ``verl-events`` command line and what it runs.

``cli`` (the command), ``demo`` and ``demo_verl`` (the CPU demos),
``report`` and ``overhead`` (reading timing logs back), ``compare`` (two
msprobe dumps side by side) and ``verl_cpu`` (verl's real trainer, tiny, on
CPU).  They use only the public core: :mod:`verl_events`,
:mod:`verl_events.config`, :mod:`verl_events.layout` and
:mod:`verl_events.verl_bridge`; nothing in the core imports them.
"""
