"""The sentinel's rules: what each ``rules:`` entry may say, checked at install.

See :mod:`verl_events.observers.sentinel.observer` for what the rules mean
when a stage ends, and :mod:`verl_events.observers.sentinel.spike` for the
spike rule's formula and why its defaults are what they are.  Option values
are checked here, naming the option path:
``option rules.actor/grad_norm.above: 'big' is not allowed; use a number``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from verl_events import ConfigError
from verl_events.config import check_count

__all__ = ["Direction", "MetricRule", "SpikeRule", "parse_rules"]

Direction = Literal["up", "down", "both"]
_DIRECTIONS: tuple[Direction, ...] = ("up", "down", "both")
_RULE_KEYS = ("above", "below", "spike", "non_finite")
_SPIKE_KEYS = ("z", "ratio", "warmup", "window", "direction")


@dataclass(frozen=True, slots=True)
class SpikeRule:
    """A spike is unusual (robust z above ``z``) and large (``ratio`` times the
    median, or ``1/ratio`` of it downwards), in ``direction``, judged once
    ``warmup`` steps are in the history of the last ``window`` values.  The
    formula, and why these are the defaults: :mod:`.spike`."""

    z: float = 6.0
    ratio: float = 2.0
    warmup: int = 4
    window: int = 50
    direction: Direction = "up"


@dataclass(frozen=True, slots=True)
class MetricRule:
    """The rules of one metric; ``non_finite`` None means the observer's default."""

    above: float | None = None
    below: float | None = None
    spike: SpikeRule | None = None
    non_finite: bool | None = None


def parse_rules(rules: Any) -> dict[str, MetricRule]:
    """The ``rules`` option, checked; ConfigError names the path, the value and what is allowed."""
    if rules is None:
        return {}
    if not isinstance(rules, Mapping):
        raise ConfigError(
            f"option rules: {rules!r} is not allowed; use a mapping of metric name to its rules, "
            "e.g. {actor/grad_norm: {above: 1000}}"
        )
    parsed = {}
    for name, spec in rules.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"option rules: the key {name!r} is not allowed; use a metric name (a non-empty string)")
        parsed[name] = _parse_metric_rule(f"rules.{name}", spec)
    return parsed


def _parse_metric_rule(where: str, spec: Any) -> MetricRule:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"option {where}: {spec!r} is not allowed; use a mapping with any of {', '.join(_RULE_KEYS)}")
    _refuse_unknown(where, spec, _RULE_KEYS)
    above = _finite_number(f"{where}.above", spec.get("above"))
    below = _finite_number(f"{where}.below", spec.get("below"))
    if above is not None and below is not None and above < below:
        raise ConfigError(
            f"option {where}: above ({above:g}) is less than below ({below:g}), so every value would trigger; "
            "above is the upper limit and below the lower one"
        )
    non_finite = spec.get("non_finite")
    if non_finite is not None and not isinstance(non_finite, bool):
        raise ConfigError(f"option {where}.non_finite: {non_finite!r} is not allowed; use true or false")
    return MetricRule(above, below, _parse_spike(f"{where}.spike", spec.get("spike")), non_finite)


def _parse_spike(where: str, spec: Any) -> SpikeRule | None:
    if spec is None or spec is False:
        return None
    if spec is True:
        return SpikeRule()
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"option {where}: {spec!r} is not allowed; "
            f"use true, false, or a mapping with any of {', '.join(_SPIKE_KEYS)}"
        )
    _refuse_unknown(where, spec, _SPIKE_KEYS)
    default = SpikeRule()
    z = _finite_number(f"{where}.z", spec.get("z"))
    if z is not None and z <= 0:
        raise ConfigError(f"option {where}.z: {z!r} is not allowed; use a positive number")
    ratio = _finite_number(f"{where}.ratio", spec.get("ratio"))
    if ratio is not None and ratio < 1:
        raise ConfigError(
            f"option {where}.ratio: {ratio!r} is not allowed; use a number of at least 1 "
            "(2: a spike is at least twice the median, or at most half of it downwards; 1: z alone decides)"
        )
    warmup = _at_least_3(f"{where}.warmup", spec.get("warmup"))
    window = _at_least_3(f"{where}.window", spec.get("window"))
    warmup = default.warmup if warmup is None else warmup
    window = max(default.window, warmup) if window is None else window
    if warmup > window:
        raise ConfigError(
            f"option {where}: warmup ({warmup} steps) is larger than window ({window} values), so the history "
            "would forget the first steps before the warm-up ends; use a warmup of at most the window"
        )
    direction = spec.get("direction", default.direction)
    if direction not in _DIRECTIONS:
        raise ConfigError(
            f"option {where}.direction: {direction!r} is not allowed; use one of {', '.join(map(repr, _DIRECTIONS))}"
        )
    return SpikeRule(
        z=default.z if z is None else z,
        ratio=default.ratio if ratio is None else ratio,
        warmup=warmup,
        window=window,
        direction=direction,
    )


def _refuse_unknown(where: str, spec: Mapping[Any, Any], allowed: tuple[str, ...]) -> None:
    unknown = [key for key in spec if key not in allowed]
    if unknown:
        raise ConfigError(f"option {where}: unknown key {unknown[0]!r}; use any of {', '.join(allowed)}")


def _finite_number(where: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"option {where}: {value!r} is not allowed; use a number{_read_as_text(value)}")
    if not math.isfinite(value):
        raise ConfigError(f"option {where}: {value!r} is not allowed; use a finite number")
    return float(value)


def _at_least_3(where: str, value: Any) -> int | None:
    if value is None:
        return None
    checked: int = check_count(
        value,
        f"option {where}",
        minimum=3,
        allowed="an integer of at least 3",
        why="a median and MAD need at least 3 values",
    )
    return checked


def _read_as_text(value: Any) -> str:
    """Why a number came as text: YAML 1.1 reads ``1.0e9`` (no sign in the exponent) and
    ``1e9`` (no dot) as strings."""
    try:
        number = float(value) if isinstance(value, str) else None
    except ValueError:
        return ""
    if number is None or not math.isfinite(number):
        return ""
    mantissa, exponent = f"{number:.15e}".split("e")
    mantissa = mantissa.rstrip("0") + ("0" if mantissa.rstrip("0").endswith(".") else "")
    return f" (YAML reads {value} as text: write it {mantissa}e{int(exponent):+d})"
