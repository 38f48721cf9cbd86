"""The memory cgroup the process runs in: its limit, its usage, its OOM kills (Linux).

cgroup v2 (``memory.max``, ``memory.current``, ``memory.events``'s
``oom_kill``) or v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``,
``memory.oom_control``'s ``oom_kill``), found from ``/proc/self/cgroup``.
Only read, never written: the cgroup may be shared.  A figure that cannot be
read is None; an unlimited limit is None too.  Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .kernel_file import KernelFile

__all__ = ["CgroupMemory", "CgroupReader", "find_cgroup", "read_cgroup"]

_ROOT = Path("/sys/fs/cgroup")
#: cgroup v1 mounts each controller in a folder of its name.
_V1_CONTROLLER = "memory"
_UNLIMITED = 2**60  # v1 writes "no limit" as a number near 2**63


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    version: int
    limit_bytes: int | None
    usage_bytes: int | None
    oom_kills: int | None


def find_cgroup(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = _ROOT) -> tuple[int, Path] | None:
    """(version, folder) of the process's memory cgroup, or None."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if _V1_CONTROLLER in controllers.split(","):
            for folder in (root / _V1_CONTROLLER / path.lstrip("/"), root / _V1_CONTROLLER):
                if (folder / "memory.usage_in_bytes").exists():
                    return 1, folder
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            for folder in (root / path.lstrip("/"), root):
                if (folder / "memory.current").exists():
                    return 2, folder
    return None


def read_cgroup(found: tuple[int, Path] | None) -> CgroupMemory | None:
    """The cgroup's figures now (each file opened, read and closed)."""
    if found is None:
        return None
    reader = CgroupReader(found)
    try:
        return reader.read()
    finally:
        reader.close()


class CgroupReader:
    """The cgroup's three files, kept open and read again at offset 0 (:mod:`.kernel_file`):
    a cgroup file's content is made anew at each read from its start."""

    def __init__(self, found: tuple[int, Path] | None) -> None:
        self.found = found
        if found is None:
            self._files: list[KernelFile] = []
        else:
            version, folder = found
            self._files = [KernelFile(folder / name) for name in (_V2_FILES if version == 2 else _V1_FILES)]

    def read(self) -> CgroupMemory | None:
        if self.found is None:
            return None
        limit, usage, events = (_text(file.read(4096)) for file in self._files)
        return CgroupMemory(self.found[0], _limit(limit), _number(usage), _field(events, "oom_kill"))

    def close(self) -> None:
        for file in self._files:
            file.close()


#: (limit, usage, the file holding oom_kill) of each version.
_V2_FILES = ("memory.max", "memory.current", "memory.events")
_V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.oom_control")


def _text(content: bytes | None) -> str | None:
    return None if content is None else content.decode(errors="replace")


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _limit(text: str | None) -> int | None:
    value = _number(text)  # v2 "max" is not a number: unlimited
    return value if value is not None and value < _UNLIMITED else None


def _field(text: str | None, name: str) -> int | None:
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return _number(value)
    return None
