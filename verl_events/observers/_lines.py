"""Appending to a JSON-lines log that several processes write at once."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["append_line"]


def append_line(path: Path, line: str) -> None:
    """Append one line with one ``write`` on an ``O_APPEND`` descriptor, so
    the lines of several ranks never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
