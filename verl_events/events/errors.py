"""Exception and warning classes, each subclassing what a caller would catch; the check of
a count that many config keys share, and the reading of a config file (their one sentence
is a ConfigError)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

#: The largest config file read: far above any real one, and a bound on what a file that is
#: not a config (a log, a device) can cost before the parser sees it.
CONFIG_FILE_LIMIT = 4 * 2**20


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


def read_config_text(path: Path, what: str) -> str:
    """The text of the config file ``path`` (``what`` names it in the error: ``config file
    'x.yaml'``).  ConfigError when it cannot be read, is not a regular file (a FIFO would
    block, a device never end), is larger than :data:`CONFIG_FILE_LIMIT` or is not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"{what} cannot be read: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd)
        if not stat.S_ISREG(mode.st_mode):
            raise ConfigError(f"{what} is not a regular file; give a YAML or JSON file")
        if mode.st_size > CONFIG_FILE_LIMIT:
            raise ConfigError(
                f"{what} holds {mode.st_size} bytes, more than a config file may "
                f"({CONFIG_FILE_LIMIT // 2**20} MiB); is it the right file?"
            )
        data = file.read(CONFIG_FILE_LIMIT + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} is not UTF-8 text (byte {exc.start})") from exc
