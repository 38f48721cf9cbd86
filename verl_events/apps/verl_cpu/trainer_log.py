"""Reading verl's trainer output as it is written: the lines so far, the steps done, the tail.

verl's console logger (``trainer.logger=[console]``, ``verl/utils/logger/aggregate_logger.py``)
prints one line per finished step, ``step:N - key:value - ...``; Ray prefixes the lines of
its worker processes with ``(TaskRunner pid=...)``, in colour when it thinks it writes to a
terminal.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FinishedStep", "LogFollower", "finished_step", "tail"]

_STEP_LINE = re.compile(r"(?:^|[\s)m])step:(\d+) - (.*)$")
_STEP_SECONDS = re.compile(r"(?:^| - )timing_s/step:([0-9.eE+-]+)(?: - |$)")


@dataclass(frozen=True)
class FinishedStep:
    """One ``step:N - ...`` line of verl's console logger."""

    step: int
    seconds: float | None  # verl's timing_s/step, when the line has it


def finished_step(line: str) -> FinishedStep | None:
    """The step a line of verl's console logger reports as finished; None for any other line."""
    found = _STEP_LINE.search(line.rstrip("\n"))
    if found is None:
        return None
    seconds = _STEP_SECONDS.search(found.group(2))
    try:
        return FinishedStep(int(found.group(1)), float(seconds.group(1)) if seconds else None)
    except ValueError:  # a timing that is no number: the step still finished
        return FinishedStep(int(found.group(1)), None)


class LogFollower:
    """Hands each complete line appended to ``path`` to ``on_line``, on :meth:`poll`.

    Not thread-safe: one caller polls, while another process writes the file.
    A missing file is not an error (the writer has not opened it yet).
    """

    def __init__(self, path: Path, on_line: Callable[[str], None]) -> None:
        self.path = path
        self.on_line = on_line
        self._offset = 0
        self._partial = b""

    def poll(self, *, final: bool = False) -> None:
        """Read what was appended since the last poll; ``final``: also the last, unterminated line."""
        try:
            with self.path.open("rb") as log:
                log.seek(self._offset)
                chunk = log.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            self.on_line(line.decode("utf-8", errors="replace"))


def tail(path: Path, count: int) -> list[str]:
    """The last ``count`` lines of the text file ``path`` (fewer when it is shorter)."""
    with path.open(encoding="utf-8", errors="replace") as log:
        return [line.rstrip("\n") for line in deque(log, maxlen=count)]
