"""Timing observer: one JSON line per stage with its time, every observer's
overhead and the bytes dumped, so overhead and disk tables can be rebuilt
from disk alone.

Each rank appends to ``{save_path}/timing/rank{R}.jsonl`` one
:class:`TimingRecord` per stage, as its :meth:`~TimingRecord.to_json`
writes it::

    {"run":"ray-session_…-01000000","stage":"actor_update","role":"actor","step":1,"rank":0,"world_size":2,
     "depth":0,"parent":null,"elapsed_s":0.41,"error":null,"message":null,
     "observers":["timing","msprobe"],"profiled":true,"profiled_by":["msprobe"],"enclosed_by":[],
     "hook_s":{"timing":0.000012,"msprobe":0.031},"hook_begin_s":{…},"hook_end_s":{…},"overhead_s":0.031,
     "end_unix":1795981267.113,"dump_bytes":48213,"event":"stage","timestamp":"2026-11-29T19:41:07.113Z"}

The record's docstring says what each field means; readers (``verl-events
report``, the demo's summary) parse lines back with
:meth:`TimingRecord.from_json`, so the field names exist only there.

``run`` names the run (see :mod:`verl_events.layout`): a save_path holding
another run's timing logs is refused (:meth:`TimingObserver.outputs`), as
msprobe's dumps are, so a log never mixes runs.  This module owns the log's
format: its folder, its file names and :class:`TimingRecord`.  ``dump_bytes`` counts this rank's files under
``{save_path}/step_{N}/{stage}``: the directories named ``rank{R}`` and
files whose name carries ``rank{R}``.

Importing this module imports no tool library (no torch): the record is
read by tools that run far from the training.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, ClassVar

import orjson
import structlog

from verl_events import InstallContext, Observer, Record, StageReport, Writes, prepare_output_dir, stage_output_dir
from verl_events.layout import run_id

from ._timing_values import WANTED, wrong_value

__all__ = [
    "TIMING_DIR",
    "NotATimingRecord",
    "TimingObserver",
    "TimingRecord",
    "rank_bytes",
    "timing_log_files",
    "timing_log_path",
]

#: The folder under ``save_path`` that holds every rank's timing log.
TIMING_DIR = "timing"


def timing_log_path(save_path: Path, rank: int) -> Path:
    """The timing log of one rank: ``{save_path}/timing/rank{R}.jsonl``."""
    return Path(save_path) / TIMING_DIR / f"rank{rank}.jsonl"


def timing_log_files(save_path: Path) -> list[Path]:
    """Every rank's timing log of a run, by file name."""
    return sorted((Path(save_path) / TIMING_DIR).glob("rank*.jsonl"))


class NotATimingRecord(ValueError):
    """A JSON line that is not a stage record of the timing observer (another
    writer's line, or one without the fields every reader needs)."""


@dataclass(frozen=True, kw_only=True)
class TimingRecord:
    """One stage on one rank: a line of ``{save_path}/timing/rank{R}.jsonl``.

    Fields without a default are the ones every reader relies on; a line
    without one of them is not a stage record.  The defaults are what a line
    of an older writer that lacks the field means.  Times are in seconds.

    - ``run``: the run id (None in logs older than run ids).
    - ``stage``, ``role``, ``step`` (None when unresolved), ``rank``,
      ``world_size``, ``depth`` (0 for a top-level stage) and ``parent`` (the
      enclosing stage): from the stage event.
    - ``elapsed_s``: the stage body alone, hooks excluded.
    - ``error``: the type name of the exception the body raised, or None;
      ``message``: its message (``str(exception)``, at most 2000 characters),
      so a run with only the timing observer still says what went wrong.
    - ``observers``: every observer that received the stage, in begin order
      (None in logs older than this field).
    - ``profiled_by``: those besides the timing observer that are not passive
      (a watcher does not make a stage profiled); ``enclosed_by``: the
      non-passive ones that held an enclosing stage open (verl's
      ``train_batch`` runs inside ``actor_update``: an msprobe session around
      it slows it too); ``profiled``: whether either has any.
    - ``hook_s``: each observer's own time in its begin plus end hooks
      (outside ``elapsed_s``), split into ``hook_begin_s`` and
      ``hook_end_s`` so a timeline can be rebuilt; ``overhead_s``: the sum of
      ``hook_s`` over the other observers, so ``elapsed_s + overhead_s`` is
      what the stage cost with profiling.
    - ``end_unix`` and ``timestamp``: the wall clock when the line was
      written, just after the last end hook (Unix seconds, and ISO 8601 UTC).
    - ``dump_bytes``: this rank's bytes under the stage's output directory.
    - ``event``: always ``"stage"``.

    Records are immutable; ``==`` compares every field.  :meth:`from_json`
    checks which keys a line has, not the types of their values (a reader
    gets what the line holds), and builds the record without ``__init__``.
    """

    run: str | None = None
    stage: str
    role: str | None = None
    step: int | None
    rank: int
    world_size: int | None = None
    depth: int = 0
    parent: str | None = None
    elapsed_s: float
    error: str | None = None
    message: str | None = None
    observers: tuple[str, ...] | None = None
    profiled: bool
    profiled_by: tuple[str, ...] = ()
    enclosed_by: tuple[str, ...] = ()
    hook_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    hook_begin_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    hook_end_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    overhead_s: float = 0.0
    end_unix: float | None = None
    dump_bytes: int = 0
    event: str = "stage"
    timestamp: str | None = None

    #: What a line is called in a reader's warning.
    noun: ClassVar[str] = "a timing record"

    def to_json(self) -> str:
        """The record as one line of JSON (no newline), keys in field order."""
        return orjson.dumps({name: getattr(self, name) for name in _FIELD_NAMES}, default=_plain_mapping).decode()

    @staticmethod
    def from_json(line: str | bytes) -> TimingRecord:
        """Parse one line of a timing log.

        Keys the record does not know are ignored and missing optional ones
        take their defaults, so lines of older writers read.  Raises
        NotATimingRecord (a ValueError) for JSON that is not a stage record,
        and ValueError for a line that is not JSON at all (a line cut short).
        Thread-safe.
        """
        data = _loads(line)
        if type(data) is not dict:
            raise NotATimingRecord(
                f"a timing line is a JSON object; this one is {type(data).__name__}: {_excerpt(line)}"
            )
        if data.keys() != _FIELDS:
            data = _completed(data, line)
        if (wrong := wrong_value(data)) is not None:
            shown = repr(data[wrong])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise NotATimingRecord(f"its {wrong} is {shown}, {WANTED[wrong]}")
        for name in _SEQUENCE_FIELDS:
            value = data[name]
            if type(value) is list:
                data[name] = tuple(value)
        # The parsed dict becomes the record's own.  Going through __init__
        # instead (a frozen dataclass sets each field with object.__setattr__)
        # would make reading a large run's logs about twice as slow.
        record = _new_object(TimingRecord)
        _set_attribute(record, "__dict__", data)
        return record


_FIELD_NAMES = tuple(f.name for f in fields(TimingRecord))
_FIELDS = frozenset(_FIELD_NAMES)
_REQUIRED = tuple(f.name for f in fields(TimingRecord) if f.default is MISSING and f.default_factory is MISSING)
_REQUIRED_KEYS = frozenset(_REQUIRED)
# What a line without some of the keys reads as, before its own keys are
# copied in: the fields' defaults, one shared read-only empty mapping where a
# field's default is a new dict, and None for the keys every line has.
# Copying a dict of the right size is faster than building one.
_DEFAULT_RECORD: dict[str, Any] = {
    f.name: MappingProxyType({}) if f.default_factory is not MISSING else None if f.default is MISSING else f.default
    for f in fields(TimingRecord)
}
# Written as JSON lists, read back as tuples.  The annotations are strings
# (postponed evaluation), hence the prefix test.
_SEQUENCE_FIELDS = tuple(f.name for f in fields(TimingRecord) if str(f.type).startswith("tuple"))
_new_object = object.__new__
_set_attribute = object.__setattr__


def _completed(data: dict[str, Any], line: str | bytes) -> dict[str, Any]:
    """A parsed line that is not exactly this writer's, as exactly the
    record's fields, or NotATimingRecord."""
    if not _REQUIRED_KEYS <= data.keys():
        missing = ", ".join(name for name in _REQUIRED if name not in data)
        raise NotATimingRecord(
            f"a timing line needs the keys {', '.join(_REQUIRED)}; this one lacks {missing}: {_excerpt(line)}"
        )
    record = _DEFAULT_RECORD.copy()
    record.update(data)
    if len(record) != len(_DEFAULT_RECORD):  # the line has keys the record does not know
        record = {name: record[name] for name in _FIELD_NAMES}
    return record


def _loads(line: str | bytes) -> Any:
    """orjson (about 4x faster on these lines), falling back to json for the
    bare NaN/Infinity that older writers (Python's json) could write and
    orjson refuses."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return Record.loads(line)


#: The longest exception message a record keeps.
MESSAGE_LIMIT = 2000


def _message(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception as exc:  # a broken __str__ must not lose the record
        text = f"<str() of the exception failed: {type(exc).__name__}>"
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def _plain_mapping(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"a timing record holds a {type(value).__name__}, which JSON cannot represent")


def _excerpt(line: str | bytes) -> str:
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    return text if len(text) <= 80 else text[:77] + "..."


class TimingObserver(Observer):
    """Record each selected stage's time and every observer's overhead.

    It runs outermost (priority 1000) so its line is written after every
    other observer has finished with the stage.  ``console: true`` also
    prints one concise line per stage to stderr.  Lines of ranks run by
    threads of one process are written whole, one at a time.
    """

    priority = 1000
    wants_timings = True
    passive = True
    sees_driver = True  # the driver's wait for generation is stage time too

    def __init__(self, console: bool = False) -> None:
        self.console = console
        self._root = Path()
        self._lock = threading.Lock()
        self._files: dict[int, IO[str]] = {}
        self._console_log: Any = None
        self._run_id: Callable[[], str] = run_id  # until setup hands over the installation's

    writes = Writes("timing log(s)", timing_log_files, "report", "verl_events.apps.report.command")

    def setup(self, context: InstallContext) -> None:
        self._root, self._run_id = context.save_path, context.run_id
        prepare_output_dir(context.save_path / TIMING_DIR)
        if self.console:
            self._console_log = structlog.wrap_logger(
                structlog.PrintLogger(sys.stderr),
                processors=[structlog.processors.KeyValueRenderer(key_order=["event", "stage", "step", "rank"])],
            )

    def _file_for(self, rank: int) -> IO[str]:
        # One file per rank, opened on first use: the rank may only be known
        # once torch.distributed is initialised, after install.
        handle = self._files.get(rank)
        if handle is None:
            # Line-buffered: each record reaches the file whole or, on a full
            # disk, raises here (readers skip a last line cut short).
            handle = self._files[rank] = timing_log_path(self._root, rank).open("a", encoding="utf-8", buffering=1)
        return handle

    def on_stage_report(self, report: StageReport) -> None:
        event = report.event
        others = tuple(name for name in report.observers if name != self.name and name not in report.passive)
        around = tuple(name for name in report.enclosing if name != self.name)
        overhead = sum(report.hook_seconds.get(name, 0.0) for name in report.observers if name != self.name)
        dump_bytes = rank_bytes(stage_output_dir(self._root, event), event.rank) if others else 0
        now = time.time()
        with self._lock:
            handle = self._file_for(event.rank)
            record = TimingRecord(
                run=self._run_id(),
                stage=event.stage,
                role=event.role,
                step=event.step,
                rank=event.rank,
                world_size=event.world_size,
                depth=event.depth,
                parent=event.parent,
                elapsed_s=event.elapsed_s,
                error=None if event.error is None else type(event.error).__name__,
                message=None if event.error is None else _message(event.error),
                observers=tuple(report.observers),
                profiled=bool(others or around),
                profiled_by=others,
                enclosed_by=around,
                hook_s=dict(report.hook_seconds),
                hook_begin_s=dict(report.begin_seconds),
                hook_end_s=dict(report.end_seconds),
                overhead_s=overhead,
                end_unix=now,
                dump_bytes=dump_bytes,
                timestamp=datetime.fromtimestamp(now, timezone.utc).isoformat().replace("+00:00", "Z"),
            )
            handle.write(record.to_json() + "\n")
        if self._console_log is not None:
            self._console_log.info(
                "stage",
                stage=event.stage,
                step=event.step,
                rank=event.rank,
                ms=round(event.elapsed_s * 1e3, 2),
                hooks_ms=round(overhead * 1e3, 2),
                observers=",".join(others) or "-",
            )

    def close(self) -> None:
        with self._lock:
            for handle in self._files.values():
                handle.close()
            self._files.clear()


def rank_bytes(stage_dir: Path, rank: int) -> int:
    """Bytes of ``rank``'s output under one stage directory (see module docstring)."""
    if not stage_dir.is_dir():
        return 0
    marker = re.compile(rf"(^|[^A-Za-z0-9])rank[_-]?{rank}([^0-9]|$)")
    total = 0
    for path in stage_dir.rglob("*"):
        if not path.is_file():
            continue
        relative = path.relative_to(stage_dir).parts
        if any(marker.search(part) for part in relative):
            total += path.stat().st_size
    return total
