"""msprobe (``mindstudio-probe``): the observer, its one adapter to msprobe, and msprobe's files.

* :mod:`.observer`: :class:`MsprobeObserver`, one dump session per selected stage;
* :mod:`._api`: the only module that imports msprobe and touches its internals;
* :mod:`._config`: reading and checking msprobe's config.json;
* :mod:`.layout`: where a session's files are, its markers, and reading them back
  (standard library only, for the tools that read dumps).
"""

from .observer import MsprobeObserver, msprobe_compare

__all__ = ["MsprobeObserver", "msprobe_compare"]
