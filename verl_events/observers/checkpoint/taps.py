"""Where the checkpoint observer sees a save's and a load's state: four torch functions.

verl's checkpoint managers write each rank's files with ``torch.save`` and read them with
``torch.load``, then hand the state to ``load_state_dict`` of the model and the optimizer.
While a :class:`Tap` is open on a thread (:func:`open_tap` to :func:`close_tap`, from a ``save_checkpoint`` or
``load_checkpoint`` stage's begin to its end), each of these calls on that thread is seen:

* ``torch.save(obj, f)``: ``obj`` is described (:func:`.contents.describe`) *before* it is
  written, since what is handed to ``save`` is what the file holds (a manager that saves a
  stale copy of its optimizer state is caught here, not by looking at the live optimizer);
  then the file's name and size;
* ``torch.load(f)``: what it returned, described: the file as it is on disk;
* ``Module.load_state_dict`` / ``Optimizer.load_state_dict``: once it returned, the
  module's or optimizer's own ``state_dict()``, described: what the rank holds now, taken
  inside verl's state-dict context, in the same form verl saved.

Anywhere else (another thread, no stage open) the calls pass straight through: one
thread-local read.  The taps are put on when the first observer asks (:func:`add_user`) and
taken off with the last (:func:`remove_user`), unless someone patched the same function
after us (theirs is left in place).  A description that fails is noted on the tap, and the
call goes on: a checkpoint is never lost to the observer.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .record import TensorEntry

__all__ = ["FileSeen", "Tap", "add_user", "close_tap", "open_tap", "part_of", "remove_user"]


def part_of(name: str) -> str:
    """Which part of a checkpoint a file holds, by verl's names for them."""
    base = os.path.basename(name)
    if base.startswith("model"):
        return "model"
    if base.startswith("optim"):
        return "optimizer"
    if base.startswith("extra_state"):
        return "extra"
    if base == "data.pt":
        return "data"
    return "other"


@dataclass
class FileSeen:
    """One file a save wrote or a load read: its name, part, size, tensors and folder."""

    name: str
    part: str
    bytes: int | None
    tensors: dict[str, TensorEntry]
    folder: str | None = None


@dataclass
class Tap:
    """What one save or load saw on its thread (see the module docstring)."""

    saved: list[FileSeen] = field(default_factory=list)
    loaded: list[FileSeen] = field(default_factory=list)
    #: What the rank holds after each load_state_dict, by part (``model``, ``optimizer``).
    applied: dict[str, dict[str, TensorEntry]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self, state: Any, what: str) -> dict[str, TensorEntry] | None:
        from .contents import describe

        started = time.perf_counter()
        try:
            return describe(state)
        except Exception as exc:
            self.failures.append(f"{what}: {type(exc).__name__}: {exc}")
            return None
        finally:
            self.seconds += time.perf_counter() - started


_local = threading.local()


def current() -> Tap | None:
    tap: Tap | None = getattr(_local, "tap", None)
    return tap


def open_tap(tap: Tap) -> Tap | None:
    """Open ``tap`` on this thread (a stage's begin); returns the tap it hides, for :func:`close_tap`."""
    outer = current()
    _local.tap = tap
    return outer


def close_tap(outer: Tap | None) -> None:
    """Close this thread's tap (the stage's end, on the thread of its begin), reopening ``outer``."""
    _local.tap = outer


def _path_of(file: Any) -> str | None:
    return os.fspath(file) if isinstance(file, (str, os.PathLike)) else getattr(file, "name", None)


def _saving(save: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(save)
    def tapped_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        tap = current()
        if tap is None:
            return save(obj, f, *args, **kwargs)
        path = _path_of(f)
        tensors = tap.describe(obj, f"describing what torch.save wrote to {path}")
        result = save(obj, f, *args, **kwargs)
        size = None
        if isinstance(path, str):
            try:
                size = os.stat(path).st_size
            except OSError:
                pass
        name = os.path.basename(path) if isinstance(path, str) else "(a stream)"
        folder = os.path.dirname(os.path.abspath(path)) if isinstance(path, str) else None
        tap.saved.append(FileSeen(name, part_of(name), size, tensors or {}, folder))
        return result

    return tapped_save


def _loading(load: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load)
    def tapped_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        result = load(f, *args, **kwargs)
        tap = current()
        if tap is not None:
            path = _path_of(f)
            name = os.path.basename(path) if isinstance(path, str) else "(a stream)"
            tensors = tap.describe(result, f"describing what torch.load read from {path}")
            tap.loaded.append(FileSeen(name, part_of(name), None, tensors or {}))
        return result

    return tapped_load


def _applying(part: str, load_state_dict: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load_state_dict)
    def tapped_load_state_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = load_state_dict(self, *args, **kwargs)
        tap = current()
        if tap is not None:
            held = tap.describe(self.state_dict(), f"describing the {part} after its load_state_dict")
            if held is not None:
                tap.applied[part] = held
        return result

    return tapped_load_state_dict


_lock = threading.Lock()
_users = 0
#: (owner, name, original, ours) for each function tapped.
_tapped: list[tuple[Any, str, Any, Any]] = []


def add_user() -> None:
    """Put the taps on, if this is their first user."""
    global _users
    import torch

    with _lock:
        _users += 1
        if _users > 1:
            return
        targets: list[tuple[Any, str, Callable[[Any], Any]]] = [
            (torch, "save", _saving),
            (torch, "load", _loading),
            (torch.nn.Module, "load_state_dict", functools.partial(_applying, "model")),
            (torch.optim.Optimizer, "load_state_dict", functools.partial(_applying, "optimizer")),
        ]
        for owner, name, wrap in targets:
            original = getattr(owner, name)
            ours = wrap(original)
            setattr(owner, name, ours)
            _tapped.append((owner, name, original, ours))


def remove_user() -> None:
    """Take the taps off with their last user."""
    global _users
    with _lock:
        _users = max(0, _users - 1)
        if _users:
            return
        for owner, name, original, ours in reversed(_tapped):
            if getattr(owner, name) is ours:  # patched again after us: theirs stays
                setattr(owner, name, original)
        _tapped.clear()
