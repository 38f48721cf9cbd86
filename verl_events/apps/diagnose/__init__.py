"""``verl-events diagnose RUN``: how a run ended, and which rank failed first."""

from __future__ import annotations

from .command import add_command, command

__all__ = ["add_command", "command"]
