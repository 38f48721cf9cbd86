"""What the watchdog's hooks and its monitor thread share: the open stages, each rank's
position and the process's idle time, under one lock."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

from verl_events import StageEvent

from .stall import IdleWatch

__all__ = ["OpenStage", "RankState", "WatchTable"]


class OpenStage:
    """A stage the watchdog is watching: its event, thread and deadline."""

    __slots__ = ("begun", "deadline", "event", "fired", "how", "seconds", "since", "started", "thread")

    def __init__(
        self, event: StageEvent, thread: int, started: float, since: float, deadline: float, seconds: float, how: str
    ) -> None:
        self.event = event
        self.thread = thread
        self.started = started  # monotonic
        self.since = since  # wall clock
        self.deadline = deadline  # monotonic
        self.seconds = seconds
        self.how = how
        self.begun = 0
        self.fired = False


@dataclass(slots=True)
class RankState:
    """What a rank's heartbeat says, as the hooks leave it."""

    rank: int
    begun: int = 0
    last_begun: OpenStage | None = None
    last_ended: tuple[str, int | None, float] | None = None
    ended: dict[str, tuple[int | None, float]] = field(default_factory=dict)
    changed: bool = True
    written: float = -math.inf  # monotonic: when its heartbeat was last written or touched
    on_disk: bool = False  # its file holds what it says now, not closed: a liveness beat only touches it
    boundary: Any = None  # its BoundaryWriter (.boundary): every boundary, stored as the hooks cross it


@dataclass(slots=True)
class WatchTable:
    """What the hooks and the monitor share: the open stages (by the stage's ``seq``) and
    each rank's state, both under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    open: dict[int, OpenStage] = field(default_factory=dict)
    ranks: dict[int, RankState] = field(default_factory=dict)
    idle: IdleWatch | None = None  # the process's time with no stage open (.stall)
