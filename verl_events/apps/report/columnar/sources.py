"""The logs DuckDB reads: each log itself, or, where DuckDB's reader cannot be trusted with
it, a scratch copy of the lines its format's owner reads as records.

A log is copied when its last line is not a whole record (a crash mid-write), when DuckDB
cannot parse it (a line that is not JSON; a value of the wrong type), or when some of its
lines lack what every record has (another writer's lines).  The owner's reader says what it
skipped, in the words of the record-by-record report, and raises where that report raises
(a line that is not JSON in the middle of a timing log is damage).  The copy holds the
lines as they were written: DuckDB reads the same bytes the owner accepted.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Sources"]

#: The end of a log read to see whether its last line is whole.
_TAIL_BYTES = 64 * 2**10

Parse = Callable[[str], Any]
Skips = Callable[[Path], list[str]]  # what the owner's reader says of a log's lines it skips


class Sources:
    """The logs ``files`` (in their order) as DuckDB reads them, with a scratch folder for copies."""

    def __init__(self, files: list[Path], parse: Parse, skips: Skips, scratch: Path) -> None:
        self.files = files
        self.paths = list(files)
        self.parse = parse
        self.skips = skips
        self.scratch = scratch
        self._notes: dict[int, list[str]] = {}
        for index, path in enumerate(files):
            if not _last_line_whole(path, parse):
                self.copy(index)

    @property
    def names(self) -> list[str]:
        return [str(path) for path in self.paths]

    @property
    def notes(self) -> list[str]:
        """What the owner's reader said of the copied logs, in the logs' order."""
        return [note for index in sorted(self._notes) for note in self._notes[index]]

    def copied(self, index: int) -> bool:
        return index in self._notes

    def copy(self, index: int) -> None:
        """Read log ``index`` by its owner (its notes kept) and hand DuckDB its good lines."""
        path = self.files[index]
        self._notes[index] = self.skips(path)
        self.scratch.mkdir(parents=True, exist_ok=True)
        copy = self.scratch / f"{index}.jsonl"
        with copy.open("w", encoding="utf-8") as out:
            for line in path.read_text(encoding="utf-8").split("\n"):
                if line.strip() and _parses(line, self.parse):
                    out.write(line + "\n")
        self.paths[index] = copy


def _last_line_whole(path: Path, parse: Parse) -> bool:
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - _TAIL_BYTES))
        lines = [line for line in handle.read().split(b"\n") if line.strip()]
    return not lines or _parses(lines[-1].decode("utf-8", "replace"), parse)


def _parses(line: str, parse: Parse) -> bool:
    try:
        parse(line)
    except ValueError:
        return False
    return True
