"""Weight sync you can check: what the trainer sent, what the engine holds, and the alarms.

* :mod:`.observer`: :class:`WeightSyncObserver`, its options, the receipt request;
* :mod:`.fingerprint`: per-tensor fingerprints (torch);
* :mod:`.judge`: one sync judged against the previous one and the receipt;
* :mod:`.canary`: the canary, fixed sequences through both models, compared (torch);
* :mod:`.served`: the canary's engine side on verl's vLLM and SGLang servers (``canary_engine``);
* :mod:`.record`: :class:`SyncRecord`, one line of ``weight_sync.jsonl``
  (standard library only, for ``verl-events weights``).
"""

from .observer import WeightSyncObserver
from .record import ALARM_KINDS, WEIGHT_SYNC_LOG, Alarm, NotASyncRecord, SyncRecord, weight_sync_log_path

__all__ = [
    "ALARM_KINDS",
    "WEIGHT_SYNC_LOG",
    "Alarm",
    "NotASyncRecord",
    "SyncRecord",
    "WeightSyncObserver",
    "weight_sync_log_path",
]
