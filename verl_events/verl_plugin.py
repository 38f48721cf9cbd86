"""verl's plugin hook: one environment variable switches a verl run over.

verl 0.9 imports every entry point of the group ``verl.plugins`` at
``import verl``, in every process (``VERL_USE_EXTERNAL_PLUGINS``, default
``auto``).  verl_events registers this module there.  With
``$VERL_EVENTS_CONFIG`` set, it installs the bridge and that config's
observers; without it, it does nothing but read the variable.

verl's loader swallows a plugin's ``Exception`` (logged at DEBUG), which
would hide a bad config and train without the observers the user asked
for.  A failure here is therefore a ``SystemExit`` with one line naming the
config and the reason: the process stops at start, before training.
"""

from __future__ import annotations

import os

if os.environ.get("VERL_EVENTS_CONFIG"):
    from .verl_bridge import install_from_environment

    install_from_environment()
