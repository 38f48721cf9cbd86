"""Reading a JSON-lines log the tools share (anomalies, replays, hangs): its lines, numbered."""

from __future__ import annotations

from pathlib import Path

__all__ = ["numbered_lines"]


def numbered_lines(path: Path) -> list[tuple[int, str]]:
    """The non-blank lines of ``path`` with their 1-based line numbers; none
    when there is no file.  OSError and UnicodeDecodeError propagate: each
    reader says in its own words what an unreadable log means to it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
