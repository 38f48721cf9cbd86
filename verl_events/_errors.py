"""Exception and warning classes; each subclasses what a caller would catch."""

from __future__ import annotations


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
