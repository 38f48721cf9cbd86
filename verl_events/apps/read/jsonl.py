"""Reading the JSON-lines logs the tools share: anomalies, replays, hangs, mismatch.

One reader for all of them: :func:`read_log` reads a log whole (no file is
no lines, blank lines are skipped, lines end at ``\\n`` only, as the writers
write them), and :meth:`JsonLinesLog.records` parses its lines one at a time
with the format owner's parser, handing each line that is not a record to
the reader's own ``skipped`` callback: every command says in its own words
what an unreadable log or a bad line means to it.

The timing logs are read by :func:`verl_events.apps.read.overhead.read_timing_records`
instead: a large run holds a million lines, read as bytes into records built
without ``__init__``, and there a line that is not JSON is damage unless it
is the last one, cut short by a crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from verl_events.layout import read_regular

__all__ = ["JsonLinesLog", "numbered_lines", "read_log", "read_records", "skipping", "why_not"]

R = TypeVar("R")


def numbered_lines(path: Path) -> list[tuple[int, str]]:
    """The non-blank lines of ``path`` with their 1-based line numbers; none
    when there is no file.  OSError propagates (a file that is not a regular one
    among them): each reader says in its own words what an unreadable log means
    to it.  Bytes that are not UTF-8 become U+FFFD, so that such a line is one
    line that is not a record, not a log that cannot be read."""
    try:
        text = read_regular(path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return [(number, line) for number, line in enumerate(text.split("\n"), 1) if line.strip()]


@dataclass(frozen=True, slots=True)
class JsonLinesLog:
    """A JSON-lines log as read: its path and its non-blank lines, numbered from 1."""

    path: Path
    lines: list[tuple[int, str]]

    def records(
        self,
        parse: Callable[[str], R],
        skipped: Callable[[int, Exception], None],
        bad: tuple[type[Exception], ...] = (ValueError,),
    ) -> Iterator[tuple[int, R]]:
        """Each line parsed by ``parse``, with its line number, in file order and
        lazily (a reader that stops at the line it wants parses no further).  A
        line whose ``parse`` raises one of ``bad`` is passed over after
        ``skipped(number, exception)``; any other exception propagates."""
        for number, line in self.lines:
            try:
                record = parse(line)
            except bad as exc:
                skipped(number, exc)
                continue
            yield number, record


def why_not(exc: Exception, noun: str) -> str:
    """Why a line was skipped, in the words every reader uses: ``not a JSON line (...)``
    (a line cut short), or ``not NOUN (...)`` with the record's own reason."""
    if isinstance(exc, json.JSONDecodeError):
        return f"not a JSON line ({exc})"
    return f"not {noun} ({exc})"


def skipping(warnings: list[str], path: Path, noun: str) -> Callable[[int, Exception], None]:
    """The ``skipped`` callback of every reader: a warning a line, ``PATH:N: not NOUN (why);
    skipped`` (:func:`why_not`)."""

    def skipped(number: int, exc: Exception) -> None:
        warnings.append(f"{path}:{number}: {why_not(exc, noun)}; skipped")

    return skipped


def read_records(
    path: Path, record: Any, warnings: list[str], needed: type[Exception] | None = None
) -> Iterator[tuple[int, Any]]:
    """Each line of the log ``path`` that is a ``record`` (a record class: its ``from_json``
    and ``noun``), with its line number.  A log that cannot be read is one warning and no
    records, or, for a command that cannot do without it, its input error ``needed``; a
    line that is not a record, a warning of :func:`skipping`."""
    try:
        log = read_log(path)
    except OSError as exc:
        if needed is not None:
            raise needed(f"{path} cannot be read: {exc}") from None
        warnings.append(f"{path} cannot be read: {exc}")
        return
    yield from log.records(record.from_json, skipping(warnings, path, record.noun))


def read_log(path: Path) -> JsonLinesLog:
    """``path`` read whole (see :func:`numbered_lines`); OSError propagates."""
    return JsonLinesLog(path, numbered_lines(path))
