"""``verl-events demo``: the CPU demos, two engines observed with the same config.

* :mod:`.tiny`: the tiny engine (the default), a miniature PPO loop in one
  or more processes, on the models and verl-shaped workers of :mod:`.model`;
* :mod:`.verl_engine`: ``--engine verl``, verl 0.9.1's real trainer on CPU
  (the job of :mod:`verl_events.apps.verl_cpu`);
* :mod:`.options`: what both share: the default config, the run's options,
  the fault ``--inject`` adds, and the preflight check;
* :mod:`.summary`: what both print at the end (the overhead table, the dumps,
  the files the observers wrote).

Importing this package imports nothing (no torch): the CLI checks the
verl engine's requirements before a torch module is imported.
"""
