"""The logs DuckDB reads, named by this reader: a link per log, or, where DuckDB's reader
cannot be trusted with a log, a scratch copy of the lines its format's owner reads as
records.

A run folder is untrusted input, and DuckDB reads a path as a pattern (``r[0]`` reads
``r0``, ``*`` any file).  So DuckDB is never handed a name from the run: each log gets a
link in the scratch folder named by its place in the list (``links/0.jsonl``), pointing at
the log's real path, and the connection may read those real paths and nothing else
(:func:`~.load.connect`).  A log that is not a regular file (a FIFO would never end, a
device never stop) is not linked at all.

A log is copied when its last line is not a whole record (a crash mid-write), when its path
holds a backslash (DuckDB would read it as a separator), when DuckDB
cannot parse it (a line that is not JSON; a value of the wrong type; a key twice in one
object), or when some of its lines lack what every record has (another writer's lines).
The owner's reader says what it skipped, in the words of the record-by-record report, and
raises where that report raises (a line that is not JSON in the middle of a timing log is
damage).  The copy holds the lines as they were written: DuckDB reads the same bytes the
owner accepted.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_events.layout import read_regular

__all__ = ["NotColumnar", "Sources", "check_plain"]

#: The end of a log read to see whether its last line is whole.
_TAIL_BYTES = 64 * 2**10
#: Characters DuckDB may read as a pattern or a home folder in a path it is given.
_PATTERN = re.compile(r"[*?\[\]{}~\\]")

Parse = Callable[[str], Any]
Skips = Callable[[Path], list[str]]  # what the owner's reader says of a log's lines it skips


class NotColumnar(Exception):
    """The logs hold what only the record-by-record report reads; the message says what."""


def check_plain(scratch: Path) -> None:
    """NotColumnar unless DuckDB reads the scratch folder's path as written: the only paths
    it is handed lie inside it, and the folder's path comes from TMPDIR, not from the run."""
    found = _PATTERN.search(str(scratch))
    if found is not None:
        raise NotColumnar(
            f"DuckDB would read its scratch folder {str(scratch)!r} as a pattern (it holds {found.group()!r}); "
            "set TMPDIR to a folder whose path has none of * ? [ ] { } ~ \\"
        )
    if not scratch.is_absolute():
        raise NotColumnar(f"DuckDB's scratch folder {str(scratch)!r} is not an absolute path; set TMPDIR to one")


class Sources:
    """The logs ``files`` (in their order) as DuckDB reads them, each through a link or a
    copy in ``scratch`` (a folder of this reader's own, :func:`check_plain`).

    NotColumnar for a log that is not a regular file."""

    def __init__(self, files: list[Path], parse: Parse, skips: Skips, scratch: Path) -> None:
        check_plain(scratch)
        self.files = files
        self.parse = parse
        self.skips = skips
        self.scratch = scratch
        #: The real paths behind the links: all the connection may read outside the scratch folder.
        self.targets: list[str] = []
        self.paths: list[Path] = []
        self._notes: dict[int, list[str]] = {}
        links = scratch / "links"
        links.mkdir(parents=True, exist_ok=True)
        for index, path in enumerate(files):
            target = _regular(path)
            link = links / f"{index}.jsonl"
            link.symlink_to(target)
            self.paths.append(link)
            # DuckDB takes a backslash in a permitted path for a separator, so a log under
            # one is read through a copy (by its owner, as one whose last line is cut).
            if "\\" in target or not _last_line_whole(path, parse):
                self.copy(index)
            else:
                self.targets.append(target)

    @property
    def names(self) -> list[str]:
        """What DuckDB is handed: paths of this reader's own making, inside the scratch folder."""
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
        copies = self.scratch / "copies"
        copies.mkdir(parents=True, exist_ok=True)
        copy = copies / f"{index}.jsonl"
        with copy.open("w", encoding="utf-8") as out:
            for line in read_regular(path).decode("utf-8", errors="replace").split("\n"):
                if line.strip() and _parses(line, self.parse):
                    out.write(line + "\n")
        self.paths[index] = copy


def _regular(path: Path) -> str:
    """The real path of the log ``path``; NotColumnar unless it is a regular file."""
    target = os.path.realpath(path)
    try:
        regular = stat.S_ISREG(os.stat(target).st_mode)
    except OSError as exc:
        raise NotColumnar(f"{path} cannot be read ({exc.strerror})") from exc
    if not regular:
        raise NotColumnar(f"{path} is not a regular file")
    return target


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
