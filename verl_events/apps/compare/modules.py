"""The module each row ran in, from msprobe's ``construct.json``.

msprobe writes construct.json beside dump.json; at levels L0 and mix it maps
each entry to its enclosing module's entry (``Functional.linear.6.forward``
-> ``Module.blocks.1.mlp.0.Linear.forward.0``; backward entries to the
module's backward entry), null for none or the root model (which msprobe
never hooks); at level L1 it is ``{}``.  A module entry
(``Module.{path}.{Class}.{forward|backward|parameters_grad}.{n}``) is its
own module.  Triage places its finding the same way
(:func:`verl_events.apps.triage.finding.place`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_events.observers.msprobe import layout as msprobe_layout

from .table import entry_parts

__all__ = ["MODULE_ENTRY", "module_of"]

MODULE_ENTRY = msprobe_layout.MODULE_ENTRY  # msprobe's name for a module's entry


def module_of(entry: str, *constructs: Mapping[str, Any]) -> str | None:
    """The path of the module a row (``entry``, a name of msprobe's table)
    ran in, ``blocks.1.mlp.0``: the row's own when it belongs to a module
    entry, else its entry's parent in the first of ``constructs`` (read
    with :func:`~verl_events.observers.msprobe.layout.read_construct`) that
    lists it.  None when none does (level L1) or the parent is null."""
    key, _ = entry_parts(entry)
    parent: Any = key
    if not MODULE_ENTRY.match(key):
        parent = next((construct[key] for construct in constructs if key in construct), None)
    match = MODULE_ENTRY.match(parent) if isinstance(parent, str) else None
    return match["path"] if match else None
