"""What a stuck rank is doing: every thread's Python stack, the user's frame,
and what torch.distributed can say of the pending collective.

**The user frame** of a stack is its innermost frame of user code, by the
one rule every reader shares (:mod:`verl_events.frames`): the standard
library, ``torch``, ``torch_npu``, ``msprobe``, ``ray``, ``blinker`` and
``verl_events`` only carry the call.  A C function that blocks
(``time.sleep``, a gloo wait) has no frame of its own: the user frame's
line is the call.

Nothing here imports torch: a process that never imported
torch.distributed has no collective to wait in.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from dataclasses import dataclass
from types import FrameType
from typing import Any

from verl_events.frames import LIBRARY_PACKAGES, is_library_frame, is_library_module

__all__ = ["LIBRARY_PACKAGES", "ThreadStack", "collective_info", "describe_where", "is_library_module", "thread_stacks"]

_DISTRIBUTED = "torch.distributed"


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's stack, outermost frame first, as (module, file, line, function, code)."""

    ident: int
    name: str
    frames: tuple[tuple[str, str, int, str, str], ...]

    @property
    def user_index(self) -> int | None:
        """The index in ``frames`` of the innermost user frame, or None."""
        for index in range(len(self.frames) - 1, -1, -1):
            if not is_library_frame(self.frames[index][0], self.frames[index][1]):
                return index
        return None

    def user_frame(self) -> dict[str, Any] | None:
        index = self.user_index
        if index is None:
            return None
        _, file, line, function, code = self.frames[index]
        return {"file": file, "line": line, "function": function, "code": code}

    def waiting_in(self) -> str | None:
        """The torch.distributed call the thread is in, below its user frame
        (``torch.distributed.all_reduce``), or None."""
        start = (self.user_index or -1) + 1
        calls = [(module, function) for module, _, _, function, _ in self.frames[start:]]
        inside = [(m, f) for m, f in calls if m.startswith(_DISTRIBUTED)]
        if not inside:
            return None
        # The c10d functions are what users call; wrappers (c10d_logger) sit above them.
        named = [(m, f) for m, f in inside if m.endswith("distributed_c10d")] or inside
        module, function = named[0]
        return f"{_DISTRIBUTED}.{function}" if module.endswith("distributed_c10d") else f"{module}.{function}"

    def waiting_on_ray(self) -> str | None:
        """``ray.get`` or ``ray.wait`` when the thread waits in one below its user frame (for
        another process's task: verl's driver for its workers, ``main_ppo`` for the driver), or None."""
        start = (self.user_index or -1) + 1
        for module, _, _, function, _ in self.frames[start:]:
            if (module == "ray" or module.startswith("ray.")) and function in ("get", "wait"):
                return f"ray.{function}"
        return None

    def render(self) -> list[str]:
        """The stack as lines, innermost last, the user frame marked ``>>``."""
        user = self.user_index
        lines = []
        for index, (_, file, line, function, code) in enumerate(self.frames):
            mark = ">>" if index == user else "  "
            lines.append(f"{mark} File {file!r}, line {line}, in {function}")
            if code:
                lines.append(f"       {code}")
        return lines


def describe_where(where: dict[str, Any] | None) -> str | None:
    """A user frame (:meth:`ThreadStack.user_frame`) as ``file:line in function: code``, or None."""
    if where is None:
        return None
    code = f": {where['code']}" if where.get("code") else ""
    return f"{where['file']}:{where['line']} in {where['function']}{code}"


def thread_stacks() -> list[ThreadStack]:
    """Every thread's stack now (``sys._current_frames``), the calling thread's excluded."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    me = threading.get_ident()
    stacks = []
    for ident, frame in sys._current_frames().items():
        if ident != me:
            stacks.append(ThreadStack(ident, names.get(ident, f"thread {ident}"), _frames(frame)))
    return sorted(stacks, key=lambda s: (s.name != "MainThread", s.name))


def _frames(frame: FrameType) -> tuple[tuple[str, str, int, str, str], ...]:
    summary = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=True)
    modules = []
    walk: FrameType | None = frame
    while walk is not None:
        modules.append(str(walk.f_globals.get("__name__", "")))
        walk = walk.f_back
    return tuple(
        (module, item.filename, item.lineno or 0, item.name, (item.line or "").strip())
        for module, item in reversed(list(zip(modules, summary, strict=True)))
    )


def collective_info() -> str:
    """What torch.distributed can tell of the pending collective, as a sentence.

    NCCL's flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0) keeps the
    last collectives of each process group; when it is on, the entries not
    completed are listed.  Other backends (gloo) keep no such record.
    """
    dist = sys.modules.get(_DISTRIBUTED)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return "not available: torch.distributed is not initialised in this process"
    backend = str(dist.get_backend())
    if "nccl" not in backend:
        return (
            f"not available with {backend}: only NCCL's flight recorder records pending collectives "
            "(TORCH_NCCL_TRACE_BUFFER_SIZE)"
        )
    if int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0") or 0) <= 0:
        return "not recorded: set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 to turn on NCCL's flight recorder"
    try:
        import pickle

        c10d = sys.modules["torch"]._C._distributed_c10d
        trace = pickle.loads(c10d._dump_nccl_trace())
        pending = [e for e in trace.get("entries", []) if e.get("state") != "completed"]
    except Exception as exc:  # a private API: say what failed, never fail the report
        return f"NCCL's flight recorder could not be read ({type(exc).__name__}: {exc})"
    if not pending:
        return "NCCL's flight recorder: no collective pending"
    shown = "; ".join(
        f"{e.get('profiling_name', '?')} seq {e.get('collective_seq_id', '?')} ({e.get('state', '?')})"
        for e in pending[-5:]
    )
    return f"NCCL's flight recorder: {len(pending)} not completed, the last: {shown}"
