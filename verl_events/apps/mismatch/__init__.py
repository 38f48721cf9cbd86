"""``verl-events mismatch RUN``: the trainer's log-probs against the rollout engine's.

* :mod:`.command`: the command (its arguments, output and exit codes);
* :mod:`.summary`: the mismatch observer's log read back, by step, trend,
  position, entropy and worst tokens;
* :mod:`.layers`: ``--layers STEP``, the layer profile from two msprobe dumps;
* :mod:`.plot`: ``--plot``.
"""
