"""Names that moved: they still resolve, with a DeprecationWarning, until 0.3."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from typing import Any

#: What :func:`moved_name` returns for a name that did not move.
NOT_MOVED: Any = object()


def moved_name(module: str, name: str, homes: Mapping[str, str]) -> Any:
    """``name``'s value from its new home in ``homes`` (name -> module), with a
    DeprecationWarning pointing at the caller's line; NOT_MOVED when ``name``
    is not in ``homes``.  Called from a module's ``__getattr__``."""
    home = homes.get(name)
    if home is None:
        return NOT_MOVED
    warnings.warn(
        f"{module}.{name} moved to {home}.{name}; the old name goes in 0.3",
        DeprecationWarning,
        stacklevel=3,  # past this function and __getattr__: the line that used the old name
    )
    return getattr(importlib.import_module(home), name)
