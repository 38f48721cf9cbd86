"""What triage reads of an msprobe 26.2 dump: its sessions, entries and call stacks.

A run's sessions, and the files each holds (dump.json, construct.json and
stack.json), are found and read through msprobe's layout
(:mod:`verl_events.observers.msprobe.layout`, the one owner of that format):
a session's place is its :class:`~verl_events.observers.msprobe.layout.SessionPlace`,
its three files read into a :class:`Session`.

What this relies on in msprobe 26.2 dumps (``step*/rank*/``), verified in
its source (``core/dump/data_dump/json_writer.py``) and on real dumps
(tests/test_triage.py):

* **Execution order is dump.json's key order.**  msprobe appends an entry
  when it is recorded; a module entry (``Module.*``), begun at its
  pre-forward hook, is popped and re-inserted when its forward ends, so it
  sits after the APIs it ran: ``Functional.linear.0.forward`` before
  ``Module.fc1.Linear.forward.0``.  Backward entries follow in the order
  autograd ran them.  construct.json maps each entry to its enclosing
  module (null for none, or the root model, which msprobe never hooks; it
  is ``{}`` at level L1) and carries no order of its own.
* Entry names: ``{Prefix}.{api}.{n}.{forward|backward}`` (APIs, levels L1
  and mix), ``Module.{path}.{Class}.{forward|backward|parameters_grad}.{n}``
  (levels L0 and mix).  Forward entries hold ``input_args``,
  ``input_kwargs``, ``output`` and, for modules, ``parameters`` (name ->
  statistics); backward entries ``input`` (the gradients arriving at the
  op's outputs) and ``output`` (the gradients it passes back, in autograd's
  order: bias, input, weight for a linear);
  ``parameters_grad`` entries map a parameter name to its gradient.  A
  tensor is a dict with ``Max``/``Min``/``Mean``/``Norm`` (bare ``NaN`` /
  ``Infinity`` tokens, which Python's json reads).
* stack.json is ``{"0": [[entry names], [frames]]}`` with each frame
  ``"File {path}, line {n}, in {function}, \\n {code}"``, innermost first,
  msprobe's own frames already removed.  msprobe records stacks of forward
  calls only; a backward entry gets the stack of its forward call.

**The user frame** is the first frame, innermost first, whose file is not
in a library that only carries the call, by the one rule every reader
shares (:func:`verl_events.frames.is_library_file`): ``torch``,
``torch_npu``, ``msprobe``, ``ray``, ``blinker`` or ``verl_events`` under
``site-packages``/``dist-packages``, the standard library, this package's
own folders, or a pseudo-file (``<frozen ...>``).  Model libraries
(transformers, verl) count as user code: their modeling files are where a
layer is written.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import STAGE_ROLES
from verl_events.frames import LIBRARY_PACKAGES, is_library_file
from verl_events.layout import replayed_stage
from verl_events.observers.msprobe import layout

SessionPlace = layout.SessionPlace

__all__ = [
    "LIBRARY_PACKAGES",
    "MODULE_ENTRY",
    "STATS",
    "Session",
    "describe_part",
    "dump_order",
    "find_dumps",
    "forward_of",
    "is_library_frame",
    "non_finite",
    "read_session",
    "run_by_torch_distributed",
    "runs_in_a_module_call",
    "same_tensor",
    "tensor_identity",
    "tensors",
    "user_frame",
]

STATS = ("Max", "Min", "Mean", "Norm")

MODULE_ENTRY = layout.MODULE_ENTRY  # msprobe's name for a module's entry
_API = re.compile(r"^(?P<api>.+\.\d+)\.(?P<dir>forward|backward)$")
_FRAME = re.compile(r"^File (?P<file>.*), line (?P<line>\d+), in (?P<function>.*?), \n ?(?P<code>.*)$", re.DOTALL)
_MODULE_FILE = "/torch/nn/modules/module.py"
_MODULE_CALL = ("_call_impl", "_wrapped_call_impl")
_STAGE_ORDER = {stage: i for i, stage in enumerate(STAGE_ROLES)}


# -- the dumps ---------------------------------------------------------------------


def dump_order(place: SessionPlace) -> tuple[int, int, str, int]:
    """Where a session sits in a run: by step, verl's stage order, stage, call
    (a replay, ``{stage}.replay``, right after its stage)."""
    stage = replayed_stage(place.stage) or place.stage
    return (place.step, _STAGE_ORDER.get(stage, len(_STAGE_ORDER)), place.stage, place.call)


def find_dumps(run: Path) -> list[SessionPlace]:
    """Every session of a known step, by step, verl's stage order, call, rank."""
    return sorted(layout.session_places(run), key=lambda place: (dump_order(place), place.rank))


@dataclass(slots=True)
class Session:
    """A dump's three files, read: entries in execution order, each entry's
    enclosing module and its call stack (empty where msprobe wrote none)."""

    dump: SessionPlace
    entries: dict[str, Any]
    parents: dict[str, str | None]
    stacks: dict[str, list[str]]


def read_session(dump: SessionPlace, notes: list[str]) -> Session | None:
    """The session, or None (with a note) when its dump file is missing or unreadable."""
    reason = layout.incomplete_reason(dump.path)
    if reason is not None:
        notes.append(f"{dump.path} is an incomplete msprobe session ({reason}); read as far as it goes")
    path = layout.dump_file(dump.path)
    try:
        entries = layout.read_dump(path)
    except layout.NotADump as exc:
        notes.append(f"{dump.path} was skipped: {exc}")
        return None
    return Session(dump, entries, layout.read_construct(path), layout.read_stacks(path))


# -- reading an entry -----------------------------------------------------------------


def tensors(value: Any, label: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every tensor's statistics in an entry (or part of one), labelled by
    where it sits: ``output.0``, ``input_args.1``, ``parameters.weight``."""
    if isinstance(value, dict):
        if "Max" in value or "Norm" in value:
            return [(label, value)]
        if "type" in value:
            return []  # a non-tensor argument
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return []
    return [found for key, item in items for found in tensors(item, f"{label}.{key}" if label else str(key))]


def non_finite(stats: dict[str, Any]) -> bool:
    return any(isinstance(v, (int, float)) and not math.isfinite(v) for s in STATS if (v := stats.get(s)) is not None)


def forward_of(entry: str) -> str:
    """The forward call an entry belongs to (msprobe keeps stacks and parameters there)."""
    if match := MODULE_ENTRY.match(entry):
        return f"Module.{match['path']}.{match['cls']}.forward.{match['n']}"
    if match := _API.match(entry):
        return f"{match['api']}.forward"
    return entry


def describe_part(entry: str, label: str) -> str:
    """A tensor's label in words: gradients say so (msprobe lists a backward
    op's outgoing gradients in autograd's order, not its inputs' order)."""
    if ".parameters_grad." in entry:
        return f"grad of {label.split('.')[0]}"
    return f"{label} (gradient)" if entry.endswith(".backward") or ".backward." in entry else label


def is_library_frame(file: str) -> bool:
    """See the module docstring (:func:`verl_events.frames.is_library_file`)."""
    return is_library_file(file)


def user_frame(frames: list[str]) -> dict[str, Any] | None:
    """The first frame of ``frames`` (innermost first) outside the libraries, parsed."""
    for frame in frames:
        match = _FRAME.match(frame)
        if match and not is_library_frame(match["file"]):
            return {
                "file": match["file"],
                "line": int(match["line"]),
                "function": match["function"],
                "code": match["code"].strip(),
            }
    return None


def run_by_torch_distributed(frames: list[str]) -> bool:
    """Whether the op was called by torch.distributed itself (its innermost
    frame is there): FSDP copying an all-gathered weight into place, a
    DTensor being redistributed.  Such an op moves a tensor and computes
    nothing from it."""
    match = _FRAME.match(frames[0]) if frames else None
    return match is not None and "/torch/distributed/" in match["file"].replace("\\", "/")


def runs_in_a_module_call(frames: list[str]) -> bool:
    """Whether some ``nn.Module`` call encloses the op (torch's ``_call_impl`` is in its
    stack): for an op msprobe maps to no module, that module is one msprobe does not hook,
    such as the root model it was given."""
    for frame in frames:
        match = _FRAME.match(frame)
        if match and match["function"] in _MODULE_CALL and match["file"].replace("\\", "/").endswith(_MODULE_FILE):
            return True
    return False


def same_tensor(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two recorded tensors are one (see :func:`tensor_identity`)."""
    return tensor_identity(a) == tensor_identity(b)


def tensor_identity(stats: dict[str, Any]) -> str:
    """What msprobe recorded of a tensor: the same tensor, seen by two ops, has the same."""
    return repr([stats.get(k) for k in ("dtype", "shape", *STATS)])
