"""Which stages an observer sees: steps, stages, roles and ranks.

Selections are compiled once, at install time, into frozensets; checking an
event is four set lookups.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, VerlEventsWarning
from .stages import STAGE_ROLES, StageEvent, check_stage_name

_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
_NUMBER = re.compile(r"^\s*(\d+)\s*$")


def parse_numbers(value: Any, key: str) -> frozenset[int] | None:
    """Parse a step or rank list like ``[1, "4-6"]`` (msprobe's syntax).

    ``None`` means "all".  A single item is accepted in place of a list.
    Items are non-negative ints or inclusive ranges ``"a-b"`` with a <= b.
    """
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else [value]
    numbers: set[int] = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise _bad_number(key, item)
        if isinstance(item, int):
            if item < 0:
                raise _bad_number(key, item)
            numbers.add(item)
            continue
        single, span = _NUMBER.match(item), _RANGE.match(item)
        if single:
            numbers.add(int(single.group(1)))
        elif span and int(span.group(1)) <= int(span.group(2)):
            numbers.update(range(int(span.group(1)), int(span.group(2)) + 1))
        else:
            raise _bad_number(key, item)
    return frozenset(numbers)


def _bad_number(key: str, item: object) -> ConfigError:
    return ConfigError(
        f"{key}: {item!r} is not allowed; use non-negative integers or inclusive "
        f'ranges like "4-6" (start <= end), e.g. {key.rsplit(".", 1)[-1]}: [1, "4-6"], '
        "or null for all"
    )


def _parse_names(value: Any, key: str) -> frozenset[str] | None:
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{key}: {item!r} is not allowed; use a list of non-empty names, or null for all")
    return frozenset(items)


@dataclass(frozen=True, slots=True)
class Selection:
    """A compiled filter; ``None`` in a field means "any"."""

    steps: frozenset[int] | None = None
    stages: frozenset[str] | None = None
    roles: frozenset[str] | None = None
    ranks: frozenset[int] | None = None

    @classmethod
    def parse(
        cls,
        *,
        steps: Any = None,
        stages: Any = None,
        roles: Any = None,
        ranks: Any = None,
        where: str = "selection",
        strict: bool = False,
    ) -> Selection:
        """Validate raw config values and compile them.

        Stage names that verl does not run warn (a typo selects nothing);
        in strict mode they are an error.
        """
        stage_set = _parse_names(stages, f"{where}.stages")
        if stage_set is not None:
            for name in stage_set:
                check_stage_name(name, where=f"{where}.stages")
            _check_known(stage_set, f"{where}.stages", strict)
        return cls(
            steps=parse_numbers(steps, f"{where}.steps"),
            stages=stage_set,
            roles=_parse_names(roles, f"{where}.roles"),
            ranks=parse_numbers(ranks, f"{where}.ranks"),
        )

    def accepts(self, event: StageEvent) -> bool:
        """True when the event falls inside every field.  An unknown step
        (None) is outside any explicit step list."""
        return (
            (self.stages is None or event.stage in self.stages)
            and (self.roles is None or event.role in self.roles)
            and (self.steps is None or event.step in self.steps)
            and (self.ranks is None or event.rank in self.ranks)
        )

    def overlaps(self, other: Selection) -> bool:
        """True when some stage could be accepted by both selections."""
        return all(
            mine is None or theirs is None or bool(mine & theirs)
            for mine, theirs in (
                (self.steps, other.steps),
                (self.stages, other.stages),
                (self.roles, other.roles),
                (self.ranks, other.ranks),
            )
        )


ALL = Selection()


def _check_known(names: Iterable[str], key: str, strict: bool) -> None:
    unknown = sorted(set(names) - STAGE_ROLES.keys())
    if not unknown:
        return
    message = (
        f"{key}: {', '.join(map(repr, unknown))} "
        f"{'is not a stage' if len(unknown) == 1 else 'are not stages'} verl runs; "
        f"known stages: {', '.join(STAGE_ROLES)}. "
        "Custom stages emitted by your own code are fine"
    )
    if strict:
        raise ConfigError(message + ", but strict mode does not allow them.")
    warnings.warn(message + ".", VerlEventsWarning, stacklevel=4)
