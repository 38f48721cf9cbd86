"""Exception and warning classes, each subclassing what a caller would catch, and the check
of a count that many config keys share (its one sentence is a ConfigError)."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is wrong.  The message names the key, the bad
    value and what is allowed."""


class ObserverSetupError(RuntimeError):
    """An observer could not be built or set up at install time."""


class ObserverError(RuntimeError):
    """An observer hook failed in strict mode.  ``__cause__`` is the original
    exception."""


class VerlEventsWarning(UserWarning):
    """A configuration that works but is probably not what was meant."""


def check_count(
    value: Any,
    key: str,
    *,
    minimum: int = 1,
    allowed: str | None = None,
    why: str = "",
    null: str | None = None,
) -> Any:
    """``value`` when it is an integer (not a bool) of at least ``minimum``.

    ``null`` says what None means for this key (``"for no limit"``); None is
    then accepted and returned.  Anything else raises ConfigError:
    ``{key}: {value!r} is not allowed; use {allowed} ({why}), or null {null}``,
    where ``allowed`` defaults to ``an integer >= {minimum}``.
    """
    if value is None and null is not None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        use = allowed or f"an integer >= {minimum}"
        use += f" ({why})" if why else ""
        use += f", or null {null}" if null is not None else ""
        raise ConfigError(f"{key}: {value!r} is not allowed; use {use}")
    return value
