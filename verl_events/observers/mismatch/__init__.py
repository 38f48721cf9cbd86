"""The training-inference mismatch: the trainer's log-probs against the rollout engine's.

* :mod:`.observer`: :class:`MismatchObserver`, its options, and the engine prefill request;
* :mod:`.tokens`: one step's comparison, token by token (torch);
* :mod:`.record`: :class:`MismatchRecord`, one line of ``mismatch.jsonl``
  (standard library only, for ``verl-events mismatch``).
"""

from .observer import MismatchObserver, sampled_sequences
from .record import MISMATCH_LOG, MismatchRecord, NotAMismatchRecord, mismatch_log_path

__all__ = [
    "MISMATCH_LOG",
    "MismatchObserver",
    "MismatchRecord",
    "NotAMismatchRecord",
    "mismatch_log_path",
    "sampled_sequences",
]
