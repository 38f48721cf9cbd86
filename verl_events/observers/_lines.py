"""Appending to a JSON-lines log that several processes write at once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["append_line", "json_object"]


def append_line(path: Path, line: str) -> None:
    """Append one line with one ``write`` on an ``O_APPEND`` descriptor, so
    the lines of several ranks never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def json_object(line: str, refused: type[ValueError]) -> dict[str, Any]:
    """``line`` parsed as a JSON object; ``refused`` (the format owner's own error) says why not."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise refused(f"not JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise refused("not a JSON object")
    return data
