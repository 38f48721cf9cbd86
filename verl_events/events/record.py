"""What every line an observer writes shares: one JSON style, one parser, and the header
a record of one stage takes from its event.

* **The style** (:meth:`Record.to_json`): one JSON object a line, its keys in the record's
  field order, and standard JSON only: a number that is not finite is written as the
  string ``"nan"``, ``"inf"`` or ``"-inf"``.  A NaN is evidence a debugging tool must keep,
  and a bare ``NaN`` is not JSON (jq, DuckDB and browsers refuse the line).  The fields a
  record lists in ``numbers`` hold only numbers, so there those strings are read back as
  floats; lines of older writers, with a bare ``NaN``, still read.
* **The parser** (:meth:`Record.parsed`, :meth:`Record.known`): a line is a JSON object
  that holds every ``required`` key, each value of the type its field declares, or the
  record's own error (``refused``, a ValueError like JSON's own) says what it is not.  A
  number is finite unless the field is one of ``numbers``, an integer fits in 64 bits, a
  field of ``not_negative`` is not below 0, a field of ``choices`` holds one of its words,
  a ``pid`` is at least 1, and a ``time`` is at most a day after the reading machine's clock
  (:data:`CLOCK_AHEAD_LIMIT_S`): a line another process (or person) wrote never brings a NaN,
  an overflow, a phantom process or a time from the future into a figure.  Keys a record does not know are passed
  over, so a newer writer's lines read.
* **The header** (:func:`stage_header`): the run id (the installation's,
  :attr:`~verl_events.InstallContext.run_id`), the time written, and the step, stage and
  rank of the event.

The timing log's record is the one exception: a large run holds a million of its lines,
written and read on a fast path of its own (:mod:`verl_events.observers.timing`).
"""

from __future__ import annotations

import functools
import json
import math
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, TypeVar

__all__ = ["CLOCK_AHEAD_LIMIT_S", "Record", "finite_or_named", "latest_time", "named_or_finite", "stage_header"]

#: How far ahead of the reading machine's clock a record's time may be.  The hosts of one
#: cluster keep their clocks within seconds of each other (NTP), so a time a day ahead was
#: damaged or crafted; taken as it is, it would stretch every span it enters (a run's
#: length, a rank's last sign of life).
CLOCK_AHEAD_LIMIT_S = 86_400.0


def latest_time() -> float:
    """The latest time a record read now may hold (:data:`CLOCK_AHEAD_LIMIT_S`)."""
    return time.time() + CLOCK_AHEAD_LIMIT_S


R = TypeVar("R", bound="Record")

_NAMED = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class _OneStage(Protocol):
    """A stage on one rank: a :class:`~verl_events.StageEvent`, or what an observer keeps of one."""

    @property
    def step(self) -> int | None: ...
    @property
    def stage(self) -> str: ...
    @property
    def rank(self) -> int: ...


def stage_header(event: _OneStage, run_id: Callable[[], str]) -> dict[str, Any]:
    """The fields a record of ``event``'s stage takes from it, written now: ``run``,
    ``time``, ``step``, ``stage`` and ``rank``."""
    return {"run": run_id(), "time": time.time(), "step": event.step, "stage": event.stage, "rank": event.rank}


def finite_or_named(value: Any) -> Any:
    """``value`` with every float that is not finite, at any depth, made its name
    (``"nan"``, ``"inf"``, ``"-inf"``); tuples become lists, as JSON has them."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: finite_or_named(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_named(item) for item in value]
    return value


def named_or_finite(value: Any) -> Any:
    """The reverse of :func:`finite_or_named`, for a value that holds only numbers."""
    if isinstance(value, str) and value in _NAMED:
        return _NAMED[value]
    if isinstance(value, dict):
        return {key: named_or_finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [named_or_finite(item) for item in value]
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """The base of the observers' JSON-lines records (see the module docstring).  A record
    is a frozen, keyword-only dataclass that sets ``refused``, ``required`` and, where a
    field holds only numbers, ``numbers``."""

    #: What a line of the log is called, in a reader's warning (``not a hang record (...)``).
    noun: ClassVar[str] = "a record"
    #: The error a line that is not this record raises (a ValueError of the format's own).
    refused: ClassVar[type[ValueError]] = ValueError
    #: The keys every line holds.
    required: ClassVar[tuple[str, ...]] = ()
    #: The fields that hold only numbers (at any depth): read back with named non-finite ones.
    numbers: ClassVar[tuple[str, ...]] = ()
    #: The number fields that are never below 0 (durations, sizes, counts).
    not_negative: ClassVar[tuple[str, ...]] = ()
    #: The text fields that hold one of a few words (a record's ``kind``), with those words.
    choices: ClassVar[dict[str, tuple[str, ...]]] = {}

    def as_dict(self) -> dict[str, Any]:
        """The fields by name, in order, as they are (not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_data(self) -> dict[str, Any]:
        """The fields by name as they are written: non-finite numbers by name, tuples as lists."""
        data: dict[str, Any] = finite_or_named(self.as_dict())
        return data

    def to_json(self) -> str:
        """One line of the record's log (no newline), in the one style."""
        return json.dumps(self.to_data(), allow_nan=False)

    @staticmethod
    def loads(line: str | bytes) -> Any:
        """``json.loads(line)``, with JSON nested deeper than Python's parser follows (a
        crafted line) a ValueError like any other line that is not JSON, not a RecursionError."""
        try:
            return json.loads(line)
        except RecursionError:
            raise ValueError("its JSON is nested too deep to read") from None

    @classmethod
    def parsed(cls, line: str | bytes) -> dict[str, Any]:
        """``line`` as a JSON object holding every required key, its ``numbers`` read back.
        A ValueError when it is not JSON (a line cut short: readers say so in their own
        words), ``refused`` when it is JSON but not this record."""
        data = cls.loads(line)
        if not isinstance(data, dict):
            raise cls.refused(f"a JSON {type(data).__name__}, not an object")
        missing = [name for name in cls.required if name not in data]
        if missing:
            raise cls.refused(f"it lacks {', '.join(missing)}")
        for name in cls.numbers:
            if name in data:
                data[name] = named_or_finite(data[name])
        return data

    @classmethod
    def from_json(cls: type[R], line: str | bytes) -> R:
        """Parse one line (:meth:`parsed`, then :meth:`known`); ``refused`` when it is not
        this record, saying why.  A record with more to check overrides it."""
        record: Any = cls
        return typing.cast(R, record.known(record.parsed(line)))

    @classmethod
    def known(cls: type[R], data: dict[str, Any]) -> R:
        """The record of ``data``'s keys that are fields (the others are passed over), each
        value checked against its field (see the module docstring)."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        hints = _hints(typing.cast(Any, cls))
        for name, value in values.items():
            if (problem := _problem(cls, name, value, hints[name])) is not None:
                raise cls.refused(problem)
        try:
            return cls(**values)
        except TypeError as exc:  # a field without a default that the line lacks
            raise cls.refused(str(exc)) from None


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    """Each field's type, resolved once per record class."""
    return typing.get_type_hints(cls)


def _problem(cls: type[Record], name: str, value: Any, hint: Any) -> str | None:
    """What is wrong with ``value`` for the field ``name`` of ``cls``, or None."""
    if not _fits(value, hint, finite=name not in cls.numbers):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return f"its {name} is {shown}, not {_said(hint)}"
    if name in cls.choices and value not in cls.choices[name]:
        return f"its {name} is {value!r}, not {' or '.join(cls.choices[name])}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if name == "time" and value > latest_time():
            return f"its time is {value!r}, more than a day after this machine's clock"
        if name in cls.not_negative and value < 0:
            return f"its {name} is {value!r}, below 0"
        if name == "pid" and value < 1:
            return f"its pid is {value!r}, which no process has"
    return None


#: The largest integer a field holds: 64 bits, what every consumer (DuckDB, a pid, a step) takes.
_INT_LIMIT = 2**63


def _fits(value: Any, hint: Any, *, finite: bool = True) -> bool:
    """Whether ``value``, read from JSON, is of the type ``hint`` (the forms records use)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (types.UnionType, typing.Union):
        return any(_fits(value, arg, finite=finite) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool) and -_INT_LIMIT <= value < _INT_LIMIT
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return -_INT_LIMIT <= value < _INT_LIMIT if isinstance(value, int) else not finite or math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(_fits(item, args[0], finite=finite) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            isinstance(key, str) and _fits(item, args[1], finite=finite) for key, item in value.items()
        )
    return isinstance(value, hint) if isinstance(hint, type) else True


def _said(hint: Any) -> str:
    """A field's type in words, for the error."""
    words = {int: "an integer", float: "a finite number", str: "text", bool: "true or false", type(None): "null"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_said(arg) for arg in args)
    if origin in (list, tuple):
        return f"a list, each {_said(args[0])}"
    if origin is dict:
        return "an object" if args[1] is Any else f"an object, each value {_said(args[1])}"
    return words.get(hint, getattr(hint, "__name__", str(hint)))
