"""Deprecated: msprobe's layout is :mod:`verl_events.observers.msprobe.layout`.

This module re-exports it, with a DeprecationWarning, until 0.3.
"""

from __future__ import annotations

import warnings

from .msprobe.layout import *  # noqa: F403
from .msprobe.layout import __all__  # noqa: F401

warnings.warn(
    "verl_events.observers.msprobe_layout moved to verl_events.observers.msprobe.layout; the old module goes in 0.3",
    DeprecationWarning,
    stacklevel=2,
)
