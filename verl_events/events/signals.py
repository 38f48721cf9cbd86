"""The bus's signals: ``stage_begin``, ``stage_end`` (and, in :mod:`._anomaly`, ``anomaly``).

All of them live in one blinker namespace.  Which stages anything listens to
is followed from here on (:mod:`._listened`); the dispatcher that gives
observers their guarantees is in :mod:`._bus`.
"""

from __future__ import annotations

from blinker import Namespace

from .listened import follow

signals = Namespace()
stage_begin = signals.signal("stage_begin", doc="Sent with the stage name as sender and event=StageEvent.")
stage_end = signals.signal("stage_end", doc="Sent with the stage name as sender and event=StageEnd.")

follow(stage_begin, stage_end)
