"""The checkpoint ledger and the checkpoint's own manifest: the two files this tool writes.

**The ledger**, ``{save_path}/checkpoints.jsonl``: one line per event of a save, a load or
the trainer's loop, each a :class:`CheckpointRecord`::

    {"run": "ray-0a1b", "kind": "saved", "step": 2, "rank": 0, "time": 1796025667.1,
     "path": "/ckpt/global_step_2/actor", "files": [{"name": "model_world_size_2_rank_0.pt",
     "part": "model", "bytes": 1843511}, ...], "parts": {"model": {"tensors": 24, "bytes": 1839104},
     "optimizer": {...}, "extra": {...}}, "updates": 1, "compared": null, "error": null,
     "alarms": [], "seconds": 0.012, "resumed_from": null, "total_steps": null, "last_step": null}

``kind`` is one of :data:`KINDS`: ``began`` (a rank began a save: written before verl
writes anything, so that a save cut short leaves its trace), ``saved`` (what the rank
wrote; ``error`` names the exception when the save raised), ``loaded`` (a resume on that
rank; ``compared`` how many tensors were compared with the save's manifest), and
``loop_ended`` (the driver, rank -1: the trainer's loop returned; ``resumed_from``,
``total_steps`` and ``last_step`` say how far it went).  ``updates`` counts the optimizer
updates (``actor_update``/``critic_update`` stages that ended without error) on this rank
since its previous save.  Each alarm is an :class:`Alarm`.  Lines are appended with one
``write`` on an ``O_APPEND`` descriptor, so ranks' lines never interleave.

**The manifest**, ``{checkpoint folder}/verl_events.rank{R}.json``: every tensor rank R
saved there (:data:`MANIFEST`), written once the save's files are, beside them, so that it
travels with the checkpoint: a resume in another run, on another host, compares what it
loaded with it.  ``{"format": 1, "run", "step", "rank", "time", "files": [...], "tensors":
{part: {name: [shape, dtype, bytes, fingerprint, nonfinite]}}}``.  Both are read back as
untrusted input: every value is checked before use.  Standard library only.
"""

from __future__ import annotations

import builtins
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verl_events import DRIVER_RANK, Record
from verl_events.layout import RunFileRefused, read_regular

__all__ = [
    "ALARM_KINDS",
    "CHECKPOINT_LOG",
    "KINDS",
    "NAMES_KEPT",
    "PARTS",
    "VALUES",
    "Alarm",
    "CheckpointRecord",
    "Manifest",
    "NotACheckpointRecord",
    "checkpoint_files",
    "checkpoint_log_path",
    "manifest_path",
    "read_manifest",
]

CHECKPOINT_LOG = "checkpoints.jsonl"
KINDS = ("began", "saved", "loaded", "loop_ended")
#: What a checkpoint file holds, by verl's file names: the model's shard, the optimizer's,
#: the extra state (the LR scheduler and the RNG states), the driver's data-loader position.
PARTS = ("model", "optimizer", "extra", "data", "other")
#: The entry of a state's values that are not tensors (settings, counters), fingerprinted together.
VALUES = "(values)"
#: Tensor names kept per alarm: a model has hundreds; ``count`` says how many there were.
NAMES_KEPT = 20

#: Each alarm's kind, and what it says.
ALARM_KINDS = {
    "unchanged": "the saved state is identical to the previous save although the optimizer stepped in between",
    "nonfinite": "the saved state holds NaN or infinite values",
    "incomplete": "a rank began the save and left no manifest, or a file differs in size from what was written",
    "not_restored": "the state after the load differs from the save's manifest, or was never loaded",
    "wrong_checkpoint": "the load came from a checkpoint that is not the folder's latest, or has no manifest",
    "no_progress": "the trainer's loop ended normally having trained none, or fewer steps than it was asked",
}


def checkpoint_log_path(save_path: Path) -> Path:
    return Path(save_path) / CHECKPOINT_LOG


def checkpoint_files(save_path: Path) -> list[Path]:
    """The run's ledger under ``save_path``, if it exists."""
    log = checkpoint_log_path(save_path)
    return [log] if log.exists() else []


class NotACheckpointRecord(ValueError):
    """A line (or manifest) that is not this tool's; the message says what it lacks."""


@dataclass(frozen=True, slots=True)
class Alarm:
    """What went wrong: ``kind`` (a key of :data:`ALARM_KINDS`), the part (``model``,
    ``optimizer``, ...; None for the whole save), the tensors (at most :data:`NAMES_KEPT`
    names; ``count`` says how many), and a sentence."""

    kind: str
    part: str | None
    tensors: list[str]
    count: int
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRecord(Record):
    """One event of a save, a load or the trainer's loop (see the module docstring)."""

    run: str
    kind: str
    step: int | None
    rank: int
    time: float
    path: str | None = None
    files: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, dict[str, int]] = field(default_factory=dict)
    updates: int | None = None
    compared: int | None = None
    error: str | None = None
    alarms: list[Alarm] = field(default_factory=list)
    seconds: float = 0.0
    resumed_from: int | None = None
    total_steps: int | None = None
    last_step: int | None = None

    noun = "a checkpoint record"
    refused = NotACheckpointRecord
    required = ("run", "kind", "step", "rank", "time")
    not_negative = ("step", "updates", "compared", "seconds", "resumed_from", "total_steps", "last_step")
    choices = {"kind": KINDS}

    def as_dict(self) -> dict[str, Any]:
        return Record.as_dict(self) | {"alarms": [asdict(alarm) for alarm in self.alarms]}

    @classmethod
    def from_json(cls, line: str | builtins.bytes) -> CheckpointRecord:
        data = cls.parsed(line)
        for name in ("path", "error"):  # printed as they are: no terminal control sequence gets through
            if isinstance(data.get(name), str):
                data[name] = printable(data[name])
        record = cls.known(data | {"alarms": []})
        if (record.rank == DRIVER_RANK) != (record.kind == "loop_ended") or record.rank < DRIVER_RANK:
            raise NotACheckpointRecord(
                f"its rank is {record.rank} for a {record.kind} line: a rank's lines have a rank >= 0, and only the "
                f"driver's (rank {DRIVER_RANK}) is the trainer loop's end"
            )
        files = [_file(entry) for entry in record.files]
        alarms = [_alarm(alarm) for alarm in _list(data.get("alarms") or [], "alarms")]
        for part, summary in record.parts.items():
            if not all(_count(summary.get(key)) for key in ("tensors", "bytes")):
                raise NotACheckpointRecord(f"its parts[{part!r}] is not {{tensors, bytes}} as counts")
        return cls.known(data | {"files": files, "alarms": alarms})


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise NotACheckpointRecord(f"its {name} is not a list")
    return value


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


#: A file's name in a checkpoint folder: a name, never a path.
_FILE_NAME = re.compile(r"^[^/\\\x00-\x1f\x7f-\x9f]{1,255}$")


def _file(entry: Any) -> dict[str, Any]:
    """A ``files`` entry, checked: a plain name (no folder), a part, a size."""
    if not isinstance(entry, dict):
        raise NotACheckpointRecord("a files entry is not an object")
    name, part, size = entry.get("name"), entry.get("part"), entry.get("bytes")
    if not isinstance(name, str) or not _FILE_NAME.match(name) or name in (".", ".."):
        raise NotACheckpointRecord(f"a files entry's name {name!r} is not a file name")
    if part not in PARTS:
        raise NotACheckpointRecord(f"a files entry's part is {part!r}, not one of {', '.join(PARTS)}")
    if size is not None and not _count(size):
        raise NotACheckpointRecord(f"a files entry's bytes is {size!r}, not a size")
    return {"name": name, "part": part, "bytes": size}


def _alarm(data: Any) -> Alarm:
    if not isinstance(data, dict):
        raise NotACheckpointRecord("an alarm is not an object")
    kind, part, tensors, count, detail = (data.get(k) for k in ("kind", "part", "tensors", "count", "detail"))
    if kind not in ALARM_KINDS:
        raise NotACheckpointRecord(f"an alarm's kind is {kind!r}, not one of {', '.join(ALARM_KINDS)}")
    if not (part is None or part in PARTS) or not isinstance(detail, str) or not isinstance(count, int):
        raise NotACheckpointRecord(f"its {kind} alarm is not {{part, count, detail}}")
    if not _count(count):
        raise NotACheckpointRecord(f"its {kind} alarm's count is {count!r}, not a count")
    if not isinstance(tensors, list) or not all(isinstance(t, str) for t in tensors):
        raise NotACheckpointRecord(f"its {kind} alarm's tensors is not a list of names")
    return Alarm(kind, part, [printable(t) for t in tensors[:NAMES_KEPT]], count, printable(detail))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character (an escape sequence's start, a newline) as ``?``."""
    return _CONTROL.sub("?", text)


# -- the manifest in the checkpoint folder -------------------------------------------------

MANIFEST = "verl_events.rank{rank}.json"
_FORMAT = 1
#: One tensor in a manifest: shape, dtype, bytes, fingerprint, count of non-finite values.
TensorEntry = tuple[tuple[int, ...], str, int, str, int]


def manifest_path(folder: Path | str, rank: int) -> Path:
    return Path(folder) / MANIFEST.format(rank=rank)


@dataclass(frozen=True, slots=True)
class Manifest:
    """What one rank saved in one checkpoint folder: its run and step, its files, and every
    tensor by part and name."""

    run: str
    step: int | None
    rank: int
    files: list[dict[str, Any]]
    tensors: dict[str, dict[str, TensorEntry]]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "run": self.run,
                "step": self.step,
                "rank": self.rank,
                "files": self.files,
                "tensors": {part: {n: list(e) for n, e in entries.items()} for part, entries in self.tensors.items()},
            },
            allow_nan=False,
        )


#: A manifest holds one checkpoint's tensors: a few hundred per part for a 70B model.  One far
#: larger was not written by us, and is not read.
MANIFEST_MAX_BYTES = 64 * 1024 * 1024


def read_manifest(path: Path) -> Manifest:
    """The manifest at ``path``; FileNotFoundError when there is none (another OSError when
    it cannot be read), NotACheckpointRecord when it is not one (a folder, a FIFO, too large,
    not ours, damaged)."""
    try:
        text = read_regular(path, MANIFEST_MAX_BYTES)
    except RunFileRefused as exc:
        raise NotACheckpointRecord(str(exc)) from None
    try:
        data = Record.loads(text)
    except ValueError as exc:
        raise NotACheckpointRecord(f"it is not JSON ({exc})") from None
    if not isinstance(data, dict) or type(data.get("format")) is not int or data["format"] != _FORMAT:
        raise NotACheckpointRecord(f"it is not a verl_events manifest of format {_FORMAT}")
    run, step, rank = data.get("run"), data.get("step"), data.get("rank")
    if not isinstance(run, str) or not (step is None or _count(step)) or not isinstance(rank, int) or not _count(rank):
        raise NotACheckpointRecord("its run, step or rank is not what a manifest holds")
    files = [_file(entry) for entry in _list(data.get("files"), "files")]
    tensors = data.get("tensors")
    if not isinstance(tensors, dict):
        raise NotACheckpointRecord("its tensors is not an object")
    return Manifest(run, step, rank, files, {str(part): _entries(part, entries) for part, entries in tensors.items()})


def _entries(part: Any, entries: Any) -> dict[str, TensorEntry]:
    if part not in PARTS or not isinstance(entries, dict):
        raise NotACheckpointRecord(f"its tensors[{part!r}] is not a part's tensors")
    checked = {}
    for name, entry in entries.items():
        if not (isinstance(entry, list) and len(entry) == 5):
            raise NotACheckpointRecord(f"its tensor {name!r} is not [shape, dtype, bytes, fingerprint, nonfinite]")
        shape, dtype, size, fingerprint, nonfinite = entry
        if not (isinstance(shape, list) and all(_count(n) for n in shape)):
            raise NotACheckpointRecord(f"its tensor {name!r} has no shape")
        if not (isinstance(dtype, str) and isinstance(fingerprint, str) and _count(size) and _count(nonfinite)):
            raise NotACheckpointRecord(f"its tensor {name!r} is not [shape, dtype, bytes, fingerprint, nonfinite]")
        checked[name] = (tuple(shape), dtype, size, fingerprint, nonfinite)
    return checked
