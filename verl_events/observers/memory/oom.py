"""An out-of-memory error told from its type and message, and the bytes it asked for.

The allocators' own words (torch 2.13; messages as they reach a Ray caller too):

* CPU: ``RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator:
  can't allocate memory: you tried to allocate 4294967296 bytes. Error code 12 ...``;
* CUDA: ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 ...``;
* Ascend NPU: ``NPU out of memory. Tried to allocate 72.00 MiB (NPU 0; ...)``, raised as
  ``torch.OutOfMemoryError`` or ``RuntimeError`` depending on the release;
* Python's own ``MemoryError``, with no size.

And Ray's memory monitor (Ray 2.60), which kills a worker from outside when its node runs
low, and then raises ``ray.exceptions.OutOfMemoryError`` at the worker's caller with its
report (:func:`ray_memory_kills`; a healthy run, an ``ActorDiedError`` and the kernel's
SIGKILL never say these words)::

    1 worker(s) were killed due to the node running low on memory. Memory on the node (IP:
    192.0.2.2, ID: ce48…) was 2.22GB used / 23.54GB limit (0.094116)
    OOM kill reason: Memory usage 2379227136B exceeded threshold of 2340556800B (9.3% of …B limit)
    …
    Ray killed 1 worker(s) based on the killing policy
    Considered workers: [
    Selected to kill: (Actor(10d4…): job ID=01000000, lease ID=…, task name=Rank.__init__,
    required resources={CPU: 1}, pid=4580, actual memory used=0.69GB, worker ID=41c2…)
    ]

(The header and each ``Selected to kill`` are one line each; Ray's "GB" are GiB: 23.54GB is
this machine's 25275990016 bytes.)  Ray's earlier wording (before 2.56: "Task was killed due
to the node running low on memory") is not read.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["RAY_REPORT_WORDS", "OutOfMemory", "RayKilledWorker", "RayMemoryKill", "out_of_memory", "ray_memory_kills"]

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_CPU = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes")
_DEVICE = re.compile(r"\b(CUDA|NPU) out of memory\. Tried to allocate (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)")
_TYPES = re.compile(r"(?:^|\.)(OutOfMemoryError|MemoryError)\b")

#: The words that open every report of Ray's memory monitor (a reader looking through a log
#: for reports can search for these first).
RAY_REPORT_WORDS = "worker(s) were killed due to the node running low on memory."
_RAY_REPORT = re.compile(
    r"(\d+) worker\(s\) were killed due to the node running low on memory\. Memory on the node "
    r"\(IP: ([^,\s]+), ID: ([^)\s]+)\) was (\d+(?:\.\d+)?)GB used / (\d+(?:\.\d+)?)GB limit"
)
_RAY_THRESHOLD = re.compile(r"OOM kill reason: Memory usage (\d+)B exceeded threshold of (\d+)B")
_RAY_SELECTED = re.compile(
    r"Selected to kill: \(([^\n]*?)pid=(\d+), actual memory used=(\d+(?:\.\d+)?)GB, worker ID=(\w+)\)"
)
_RAY_TASK = re.compile(r"task name=([^,\n]+),")
#: Where a report's list of killed workers ends; a report cut short ends at the next one.
_RAY_REPORT_END = "Total non-selected idle workers"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """Where memory ran out (``cpu``, ``cuda``, ``npu``, or None when the error does not say)
    and the bytes the failing allocation asked for (None when the message gives none)."""

    device: str | None
    asked_bytes: int | None


def out_of_memory(text: str) -> OutOfMemory | None:
    """The out-of-memory error in ``text`` (an exception's ``Type: message``), or None."""
    if found := _CPU.search(text):
        return OutOfMemory("cpu", int(found[1]))
    if found := _DEVICE.search(text):
        return OutOfMemory(found[1].lower(), round(float(found[2]) * _UNITS[found[3]]))
    head = text.split(":", 1)[0].strip()
    if _TYPES.search(head):
        return OutOfMemory(None, None)
    return None


@dataclass(frozen=True, slots=True)
class RayKilledWorker:
    """One worker Ray's memory monitor selected and killed: its process, what Ray measured it
    at, and the task Ray names (``Rank.__init__`` for an actor: its creation task, whatever
    method ran) or None."""

    pid: int
    used_bytes: int
    task: str | None
    worker_id: str


@dataclass(frozen=True, slots=True)
class RayMemoryKill:
    """One report of Ray's memory monitor: ``workers`` killed on the node at ``node_ip``, which
    stood at ``used_bytes`` of ``limit_bytes`` (Ray's figures, to 0.01 GiB) past
    ``threshold_bytes`` (None when the text holds no kill reason).  ``killed`` holds the
    workers it names, by pid; it is empty when the text was cut before them (a message
    shortened to its first lines)."""

    workers: int
    node_ip: str
    node_id: str
    used_bytes: int
    limit_bytes: int
    threshold_bytes: int | None
    killed: tuple[RayKilledWorker, ...]


def _gib(text: str) -> int:
    return round(float(text) * 2**30)


def ray_memory_kills(text: str) -> list[RayMemoryKill]:
    """Each report of Ray's memory monitor in ``text`` (an exception's message, a driver's
    output, with or without colour codes), in order; an empty list when there is none.  A
    report that a traceback repeats (a ``RayTaskError`` around the ``OutOfMemoryError``) is
    returned each time it appears."""
    if RAY_REPORT_WORDS not in text:
        return []
    text = _ANSI.sub("", text)
    heads = list(_RAY_REPORT.finditer(text))
    found = []
    for head, after in zip(heads, [*heads[1:], None], strict=True):
        body = text[head.end() : after.start() if after is not None else len(text)]
        body = body.split(_RAY_REPORT_END, 1)[0]
        threshold = _RAY_THRESHOLD.search(body)
        killed = tuple(
            RayKilledWorker(
                int(pid),
                _gib(used),
                task[1].strip() if (task := _RAY_TASK.search(before)) else None,
                worker,
            )
            for before, pid, used, worker in _RAY_SELECTED.findall(body)
        )
        found.append(
            RayMemoryKill(
                int(head[1]),
                head[2],
                head[3],
                _gib(head[4]),
                _gib(head[5]),
                int(threshold[2]) if threshold else None,
                killed,
            )
        )
    return found
