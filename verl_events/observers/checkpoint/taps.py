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
* ``Module.load_state_dict``, once it returned, and ``Optimizer.__setstate__``, where an
  optimizer's ``load_state_dict`` hands it the loaded state (torch's, and those written
  after it): the module's or optimizer's own ``state_dict()``, described: what the rank
  holds now, taken inside verl's state-dict context, in the same form verl saved.

Only a save to, or a load from, a file named by its path is seen: a checkpoint writer that
streams tensors (``torch.distributed.checkpoint``) is not, and its checkpoints compare
nothing.

Anywhere else (another thread, no stage open) the calls pass straight through: one
thread-local read.  The taps are put on when the first observer asks (:func:`add_user`) and
taken off with the last (:func:`remove_user`), unless someone patched the same function
after us: theirs is left in place, calling ours, which passes straight through until the
taps are put on again (then ours is used as it is, never wrapped twice).  A tap its observer
closed (:meth:`Tap.close`) sees nothing more.  A description that fails is noted on the tap
and its part is left undescribed (never compared), and the call goes on: a checkpoint is
never lost to the observer.
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
    """One file a save wrote or a load read: its name, part, size, folder and tensors (None
    when they could not be described)."""

    name: str
    part: str
    bytes: int | None
    tensors: dict[str, TensorEntry] | None
    folder: str


@dataclass
class Tap:
    """What one save or load saw on its thread (see the module docstring)."""

    saved: list[FileSeen] = field(default_factory=list)
    loaded: list[FileSeen] = field(default_factory=list)
    #: What the rank holds after each load_state_dict, by part (``model``, ``optimizer``).
    applied: dict[str, dict[str, TensorEntry]] = field(default_factory=dict)
    #: The parts whose state after loading could not be described: not compared.
    undescribed: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    closed: bool = False

    def close(self) -> None:
        """See nothing more (the observer closed while its stage was open)."""
        self.closed = True

    def describe(self, state: Callable[[], Any], what: str) -> dict[str, TensorEntry] | None:
        """``state()`` described, or None when that failed (noted in ``failures``)."""
        from .contents import describe

        started = time.perf_counter()
        try:
            return describe(state())
        except Exception as exc:
            self.failures.append(f"{what}: {type(exc).__name__}: {exc}")
            return None
        finally:
            self.seconds += time.perf_counter() - started


_local = threading.local()


def current() -> Tap | None:
    tap: Tap | None = getattr(_local, "tap", None)
    return None if tap is None or tap.closed else tap


def open_tap(tap: Tap) -> Tap | None:
    """Open ``tap`` on this thread (a stage's begin); returns the tap it hides, for :func:`close_tap`."""
    outer = getattr(_local, "tap", None)
    _local.tap = tap
    return outer


def close_tap(outer: Tap | None) -> None:
    """Close this thread's tap (the stage's end, on the thread of its begin), reopening ``outer``."""
    _local.tap = outer


def _path_of(file: Any) -> str | None:
    """The path a save or load names, or None for a stream."""
    return os.path.abspath(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else None


def _saving(save: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(save)
    def tapped_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        tap = current()
        path = _path_of(f) if tap is not None else None
        if tap is None or path is None:
            return save(obj, f, *args, **kwargs)
        tensors = tap.describe(lambda: obj, f"describing what torch.save wrote to {path}")
        result = save(obj, f, *args, **kwargs)
        try:
            size: int | None = os.stat(path).st_size
        except OSError:
            size = None
        name = os.path.basename(path)
        tap.saved.append(FileSeen(name, part_of(name), size, tensors, os.path.dirname(path)))
        return result

    return tapped_save


def _loading(load: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load)
    def tapped_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        result = load(f, *args, **kwargs)
        tap = current()
        path = _path_of(f) if tap is not None else None
        if tap is not None and path is not None:
            name = os.path.basename(path)
            tensors = tap.describe(lambda: result, f"describing what torch.load read from {path}")
            tap.loaded.append(FileSeen(name, part_of(name), None, tensors, os.path.dirname(path)))
        return result

    return tapped_load


def _holding(part: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (a module's ``load_state_dict``, an optimizer's ``__setstate__``), followed by
    a description of what its owner holds once it returned."""

    @functools.wraps(method)
    def tapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        tap = current()
        if tap is not None:
            held = tap.describe(self.state_dict, f"describing the {part} after it was loaded")
            if held is None:
                tap.undescribed.add(part)
            else:
                tap.applied[part] = held
        return result

    return tapped


_lock = threading.Lock()
_users = 0
#: (owner, name, original, ours) for each function tapped.
_tapped: list[tuple[Any, str, Any, Any]] = []
#: Ours, left in place under a later patch when the taps came off: used again, never rewrapped.
_stranded: list[tuple[Any, str, Any, Any]] = []


def add_user() -> None:
    """Put the taps on, if this is their first user."""
    global _users
    import torch

    with _lock:
        _users += 1
        if _users > 1:
            return
        # Ours is still called under the later patch, unless that patch was taken off since
        # (the original is back in place): then it is wrapped anew below.
        still = [entry for entry in _stranded if getattr(entry[0], entry[1]) is not entry[2]]
        stranded = {(owner, name) for owner, name, _, _ in still}
        _tapped.extend(still)
        _stranded.clear()
        targets: list[tuple[Any, str, Callable[[Any], Any]]] = [
            (torch, "save", _saving),
            (torch, "load", _loading),
            (torch.nn.Module, "load_state_dict", functools.partial(_holding, "model")),
            (torch.optim.Optimizer, "__setstate__", functools.partial(_holding, "optimizer")),
        ]
        for owner, name, wrap in targets:
            if (owner, name) in stranded:
                continue
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
        for entry in reversed(_tapped):
            owner, name, original, ours = entry
            if getattr(owner, name) is ours:
                setattr(owner, name, original)
            else:  # patched again after us: theirs stays, and calls ours
                _stranded.append(entry)
        _tapped.clear()
