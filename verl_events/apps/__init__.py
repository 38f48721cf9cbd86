"""The tools built on the core: the ``verl-events`` command line and what it runs.

``cli`` (the command), ``demo`` and ``demo_verl`` (the CPU demos),
``report`` and ``overhead`` (reading timing logs back), ``compare`` (two
msprobe dumps side by side), ``verl_cpu`` (verl's real trainer, tiny, on
CPU), ``triage`` (the op behind an anomaly: ``msprobe_dump`` reads the dumps,
``triage_non_finite`` and ``triage_spike`` search them) and ``inject`` (a fault to try the
sentinel with).  They use only public names: :mod:`verl_events`,
:mod:`verl_events.config`, :mod:`verl_events.layout`,
:mod:`verl_events.verl_bridge` and the observers' public modules
(``verl_events.observers.msprobe_layout``, ``.timing``); nothing in the core
imports them.
"""
