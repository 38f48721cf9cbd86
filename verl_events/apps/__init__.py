"""The tools built on the core: the ``verl-events`` command line and what it runs.

``cli`` (the command), ``demo/`` (the CPU demos: the tiny engine and
``--engine verl``), ``report`` and ``overhead`` (reading timing logs back),
``compare/`` (two msprobe dumps side by side), ``triage/`` (the op behind an
anomaly: ``triage.dumps`` reads the dumps, ``triage.non_finite`` and
``triage.spike`` search them), ``verl_cpu`` (verl's real trainer, tiny, on
CPU) and ``inject`` (a fault to try the sentinel with).  They use only
public names: :mod:`verl_events`, :mod:`verl_events.config`,
:mod:`verl_events.layout`, :mod:`verl_events.verl_bridge` and the
observers' public modules, which own the files the tools read
(``verl_events.observers.msprobe.layout``, ``.timing``,
``.sentinel.record``, imported once, in ``formats``); nothing in the core
imports them.
"""
