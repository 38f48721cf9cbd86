"""The tools built on the core: the ``verl-events`` command line and what it runs.

``tools`` is the one registration: a row per command (``check``, ``demo``,
``report``, ``compare``, ``triage``, ``hangs``, ``mismatch``, ``diagnose``)
naming its module (``add_command``/``command``), the observer whose files
it reads and that observer's format owner; ``cli`` builds the parser from
it.  Beside each tool: ``check`` (a config, built without being set up),
``demo/`` (the CPU demos: the tiny engine and ``--engine verl``),
``report/`` (timing logs read back: stages by step, overhead, stragglers,
stages that raised, ``--trace``), ``compare/`` (two msprobe dumps side by
side), ``triage/`` (the op behind an anomaly), ``hangs`` (which rank is
stuck where), ``mismatch/`` (the trainer's log-probs against the rollout
engine's), ``diagnose/`` (how a run ended), ``gather/`` (a run kept on
each node's own disk, collected through Ray), ``verl_cpu`` (verl's real
trainer, tiny, on CPU) and ``inject`` (a fault to try the sentinel with).
``jsonl`` reads the JSON-lines logs they share and ``tables`` prints rich
tables that cut nothing short.

They use only public names: :mod:`verl_events`, :mod:`verl_events.config`,
:mod:`verl_events.layout`, :mod:`verl_events.verl_bridge` and the
observers' public modules, which own the files the tools read
(``verl_events.observers.msprobe.layout``, ``.timing``,
``.sentinel.record``, ``.watchdog.record``, ``.watchdog.crash``,
``.mismatch.record``, imported once, in ``formats``); nothing in the core
imports them.
"""
