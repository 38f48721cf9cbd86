"""The probe: look up a library's internals once, and name every one that is missing.

The msprobe adapter (:mod:`._api`) asks a :class:`Probe` for each module,
attribute and function it will use, with the shape it calls it with; the
probe records what is absent or shaped differently, and
:meth:`Probe.raise_if_missing` raises one ObserverSetupError naming all of
it, the installed version and what to install instead.  The probe itself
names no library: it imports what it is asked for.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from verl_events import ObserverSetupError

#: What the probe returns for something it could not find (and recorded).
MISSING: Any = object()


class Probe:
    """Looks things up in msprobe and records each one that is missing or
    shaped differently, so that one error names them all."""

    def __init__(self, purpose: str, installed: str, supported: str, install_hint: str) -> None:
        self.purpose = purpose
        self.installed, self.supported, self.install_hint = installed, supported, install_hint
        self.missing: list[str] = []

    def module(self, name: str) -> Any:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            self.missing.append(f"module {name} ({type(exc).__name__}: {exc})")
            return MISSING

    def attribute(self, owner: Any, where: str, name: str) -> Any:
        """``owner.name``; MISSING, recorded, when it is absent.  An owner
        that is itself MISSING was recorded already."""
        if owner is MISSING:
            return MISSING
        try:
            return getattr(owner, name)
        except AttributeError:
            self.missing.append(f"{where}.{name}")
            return MISSING

    def function(
        self,
        owner: Any,
        where: str,
        name: str,
        positional: tuple[str, ...] = (),
        keywords: tuple[str, ...] = (),
        *,
        kind: type | None = None,
    ) -> Any:
        """``owner.name``, checked to accept ``name(*positional, **keywords)``
        and, with ``kind`` (classmethod, property), to be defined as one."""
        value = self.attribute(owner, where, name)
        if value is MISSING:
            return MISSING
        if kind is not None and not isinstance(defined := inspect.getattr_static(owner, name), kind):
            self.missing.append(f"{where}.{name} as a {kind.__name__}: it is a {type(defined).__name__}")
            return MISSING
        if kind is property:
            return value
        try:
            signature = inspect.signature(value)
        except ValueError:
            # No signature to read (a C function): the call shape cannot be
            # checked here, so it is not called a mismatch.
            return value
        try:
            signature.bind(*positional, **dict.fromkeys(keywords))
        except TypeError:
            called = ", ".join([*positional, *(f"{k}=" for k in keywords)])
            self.missing.append(f"{where}.{name}({called}): it is {where}.{name}{unannotated(signature)}")
            return MISSING
        return value

    def raise_if_missing(self) -> None:
        if not self.missing:
            return
        raise ObserverSetupError(
            f"{self.installed} lacks what {self.purpose} relies on: "
            f"{'; '.join(self.missing)}. verl_events is written against {self.supported}; "
            f"install a supported version with: {self.install_hint}"
        )


def unannotated(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` as a reader compares it with a call: names and defaults only."""
    empty = inspect.Parameter.empty
    parameters = [p.replace(annotation=empty) for p in signature.parameters.values()]
    return signature.replace(parameters=parameters, return_annotation=empty)
