"""The values of a timing line that a reader computes with, checked on the fast path: a line
another writer (or a hand) left with text where a number belongs, a NaN, a negative
duration or an integer past 64 bits is no stage record (see :mod:`.timing`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_events.events.record import latest_time

__all__ = ["WANTED", "wrong_value"]

#: What each field a reader computes with must be, in words.
WANTED = {
    "stage": "not text",
    "step": "not an integer or null",
    "rank": "not an integer",
    "elapsed_s": "not a number of seconds (finite, not below 0)",
    "profiled": "not true or false",
    "depth": "not a count",
    "overhead_s": "not a number of seconds (finite, not below 0)",
    "end_unix": "not a time (a finite number, at most a day after this machine's clock) or null",
    "dump_bytes": "not a count",
    "observers": "not a list of names or null",
    "hook_s": "not an object of seconds (finite, not below 0)",
    "hook_begin_s": "not an object of seconds (finite, not below 0)",
    "hook_end_s": "not an object of seconds (finite, not below 0)",
}
_INT_LIMIT = 2**63  # a step, rank or count past 64 bits is no step: DuckDB and the tables take 64
_SECONDS_LIMIT = 1e12  # past this no stage ran (about 30,000 years)


def wrong_value(data: dict[str, Any]) -> str | None:
    """The first field a reader computes with whose value is not of its type or range, or
    None.  The fast path, a million lines a large run: one chain of type() tests and chained
    comparisons (a NaN fails them all); the field is named only for a line that fails it."""
    step, rank, depth, dump, end = data["step"], data["rank"], data["depth"], data["dump_bytes"], data["end_unix"]
    latest = latest_time()
    elapsed, overhead, observers = data["elapsed_s"], data["overhead_s"], data["observers"]
    if (
        type(data["stage"]) is str
        and (step is None or (type(step) is int and -_INT_LIMIT <= step < _INT_LIMIT))
        and type(rank) is int
        and -_INT_LIMIT <= rank < _INT_LIMIT
        and type(data["profiled"]) is bool
        and type(depth) is int
        and 0 <= depth < _INT_LIMIT
        and type(dump) is int
        and 0 <= dump < _INT_LIMIT
        and (type(elapsed) is float or type(elapsed) is int)
        and 0 <= elapsed < _SECONDS_LIMIT
        and (type(overhead) is float or type(overhead) is int)
        and 0 <= overhead < _SECONDS_LIMIT
        and (end is None or ((type(end) is float or type(end) is int) and 0 <= end <= latest))
        and (observers is None or _names(observers))
        and _hooks(data["hook_s"])
        and _hooks(data["hook_begin_s"])
        and _hooks(data["hook_end_s"])
    ):
        return None
    checks = (
        ("stage", type(data["stage"]) is str),
        ("step", step is None or (type(step) is int and -_INT_LIMIT <= step < _INT_LIMIT)),
        ("rank", type(rank) is int and -_INT_LIMIT <= rank < _INT_LIMIT),
        ("elapsed_s", _seconds(elapsed)),
        ("profiled", type(data["profiled"]) is bool),
        ("depth", type(depth) is int and 0 <= depth < _INT_LIMIT),
        ("overhead_s", _seconds(overhead)),
        ("end_unix", end is None or (_seconds(end) and end <= latest)),
        ("dump_bytes", type(dump) is int and 0 <= dump < _INT_LIMIT),
        ("observers", observers is None or _names(observers)),
        ("hook_s", _hooks(data["hook_s"])),
        ("hook_begin_s", _hooks(data["hook_begin_s"])),
    )
    return next((name for name, right in checks if not right), "hook_end_s")


def _seconds(value: Any) -> bool:
    return (type(value) is float or type(value) is int) and 0 <= value < _SECONDS_LIMIT


def _names(value: Any) -> bool:
    for name in value if type(value) is list or type(value) is tuple else (None,):
        if type(name) is not str:
            return False
    return True


def _hooks(value: Any) -> bool:
    if type(value) is not dict and not isinstance(value, Mapping):
        return False
    for name, seconds in value.items():
        if type(name) is not str or not (type(seconds) is float or type(seconds) is int) or not 0 <= seconds < 1e12:
            return False
    return True
