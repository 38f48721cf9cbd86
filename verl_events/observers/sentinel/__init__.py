"""The sentinel: the observer, its rules, and the anomaly record it writes.

* :mod:`.observer`: :class:`SentinelObserver`, which checks every stage's metrics;
* :mod:`.rules`: the ``rules:`` option, parsed and checked at install;
* :mod:`.spike`: the spike rule at work (:class:`SpikeHistory`) and its
  :class:`SpikeMargin`, with the formula and why its defaults are what they are;
* :mod:`.record`: :class:`AnomalyRecord`, one line of ``anomalies.jsonl``
  (standard library only, for ``verl-events triage``).
"""

from .observer import SentinelObserver
from .record import ANOMALY_LOG, AnomalyRecord, anomaly_log_path
from .rules import MetricRule, SpikeRule, parse_rules
from .spike import SpikeMargin

__all__ = [
    "ANOMALY_LOG",
    "AnomalyRecord",
    "MetricRule",
    "SentinelObserver",
    "SpikeMargin",
    "SpikeRule",
    "anomaly_log_path",
    "parse_rules",
]
