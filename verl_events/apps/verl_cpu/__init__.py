"""Run verl 0.9.1's real PPO trainer (``python -m verl.trainer.main_ppo``) on a CPU-only machine.

verl 0.9.1 has no CPU path. This subpackage supplies what the demo and the integration
test need to drive the unmodified trainer end to end on CPU, without editing any verl file:

- :mod:`verl_events.apps.verl_cpu.shim` is loaded by verl itself in every process it starts
  (``VERL_USE_EXTERNAL_MODULES=verl_events.apps.verl_cpu.shim``). It registers a ``cpu``
  platform (``VERL_PLATFORM=cpu``), an ``hf`` rollout (HF ``generate`` in a Ray actor,
  see :mod:`verl_events.apps.verl_cpu.hf_rollout`, which also prefills a trainer's sequences
  for the mismatch observer's layer profile) and a few small patches.
- :mod:`verl_events.apps.verl_cpu.engine_options` points the mismatch and weight_sync
  observers of a config at that rollout server (they name no engine by default).
- :mod:`verl_events.apps.verl_cpu.job` builds a tiny offline job (random Qwen2 model, byte-level
  BPE tokenizer, RL parquet, reward function) and the Hydra overrides and environment that
  run it: ``python -m verl_events.apps.verl_cpu.job WORKDIR [overrides...]``.
- :mod:`verl_events.apps.verl_cpu.reward` holds the job's reward function.
- :mod:`verl_events.apps.verl_cpu.session` runs the trainer in a session of its own and leaves
  none of its processes behind; :mod:`verl_events.apps.verl_cpu.trainer_log` reads its output
  as it is written (the steps it finished, the end of the log).

Test-only: nothing here is meant for real training.
"""
