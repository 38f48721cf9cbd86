"""The CUDA allocator's history, tagged with our stages, and a snapshot when an allocation runs out.

With ``record_history: true`` on a CUDA machine the memory observer:

* turns on the caching allocator's history (``torch.cuda.memory._record_memory_history``,
  ``context="all"``, Python stacks, at most ``history_entries`` events: a ring, the
  oldest dropped first);
* tags every allocation with the stage that made it (``_set_memory_metadata``:
  ``actor_update step 3 rank 0``), which the snapshot keeps with each allocation;
* attaches an out-of-memory observer (``torch._C._cuda_attach_out_of_memory_observer``),
  which the allocator calls before it raises: it dumps a snapshot to
  ``{save_path}/memory/oom_rank{R}_step{S}_{stage}.pickle``, which PyTorch's memory viewer
  (https://pytorch.org/memory_viz, or ``python -m torch.cuda._memory_viz``) opens.

Without CUDA it does nothing and the observer says so once; the per-stage figures are
recorded either way.  Ascend NPU's equivalents (``torch_npu``) are not wired: NPU runs
get the figures, not the history.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from .record import oom_snapshot_path

__all__ = ["History", "cuda_oom_attacher"]

logger = logging.getLogger("verl_events.memory")


def cuda_oom_attacher() -> Any:
    """torch's function that attaches a CUDA out-of-memory observer, or None."""
    import torch

    return getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)


class History:
    """The allocator history of one process (see the module docstring)."""

    def __init__(self, memory: Any, attach: Any, save_path: Path, max_entries: int) -> None:
        self.memory = memory  # torch.cuda.memory
        self.attach = attach
        self.save_path = save_path
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._open: list[tuple[int, str, int | None, str, int]] = []  # (seq, label, step, stage, rank)
        self.snapshots: list[Path] = []

    def start(self) -> None:
        self.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=self.max_entries)
        if self.attach is not None:
            self.attach(self._on_out_of_memory)

    def stop(self) -> None:
        self.memory._record_memory_history(enabled=None)

    def stage_begins(self, seq: int, stage: str, step: int | None, rank: int) -> None:
        label = f"{stage} step {step} rank {rank}"
        with self._lock:
            self._open.append((seq, label, step, stage, rank))
            self.memory._set_memory_metadata(label)

    def stage_ends(self, seq: int) -> None:
        with self._lock:
            self._open = [entry for entry in self._open if entry[0] != seq]
            self.memory._set_memory_metadata(self._open[-1][1] if self._open else "")

    def _on_out_of_memory(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        """Called by the allocator before it raises (the allocator's own arguments)."""
        with self._lock:
            _, _, step, stage, rank = self._open[-1] if self._open else (0, "", None, "outside", 0)
        path = oom_snapshot_path(self.save_path, rank, step, stage)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.memory._dump_snapshot(str(path))
        except Exception:  # the process is failing already: say why, never raise from here
            logger.exception("memory: the snapshot at the out-of-memory could not be written to %s", path)
            return
        self.snapshots.append(path)
        logger.error(
            "memory: out of memory on device %d in %s at step %s (asked %d bytes, %d free of %d): snapshot %s",
            device,
            stage,
            step,
            alloc,
            device_free,
            device_total,
            path,
        )
