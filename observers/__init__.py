"""Built-in observers, one module per tool.

Each module imports its tool when the observer is first used, never at
import time.  They are registered as entry points of the group
``verl_events.observers`` (see pyproject.toml), exactly like a third-party
observer, and are normally loaded by name from config.
"""

__all__: list[str] = []
