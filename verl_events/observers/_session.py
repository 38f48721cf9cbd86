"""One capture session per process, shared by the tools that can only run one."""

from __future__ import annotations

import logging
import threading

from verl_events import StageEvent


class SessionSlot:
    """Who holds a tool's single session, and the lock that guards it.

    Use under ``with slot.lock``: :meth:`refuse` warns and returns True when
    another stage (nested, or on another thread) already holds the slot;
    :meth:`release` frees it when ``event`` is the holder's end.
    """

    def __init__(self, tool: str, verb: str, logger: logging.Logger) -> None:
        self.tool, self.verb, self.logger = tool, verb, logger
        self.lock = threading.Lock()
        self.holder: StageEvent | None = None

    def refuse(self, event: StageEvent) -> bool:
        holder = self.holder
        if holder is None:
            return False
        self.logger.warning(
            "%s: stage %r (step %s, depth %d) is not %s: stage %r (step %s) already has %s's "
            "one-per-process session open (nested stage or another thread)",
            self.tool,
            event.stage,
            event.step,
            event.depth,
            self.verb,
            holder.stage,
            holder.step,
            self.tool,
        )
        return True

    def release(self, event: StageEvent) -> bool:
        if self.holder is None or self.holder.seq != event.seq:
            return False
        self.holder = None
        return True
