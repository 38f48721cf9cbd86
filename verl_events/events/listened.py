"""The core's own record of which stages something receives.

The emit path asks one question before it builds anything:
``stage in listeners.stages``.  This module keeps the answer, from blinker's
public ``receiver_connected`` / ``receiver_disconnected`` signals of the
stage signals it follows (``stage_begin`` and ``stage_end``), so dispatchers
and plain receivers count alike, each connection once: two dispatchers on
one stage keep it listened until both left, and a receiver of either signal
makes its stages emit.  Receivers connected for a sender that is not a
stage name (nor ``ANY``) never get a stage, so they count for nothing.

One case is conservative: blinker drops a *weakly* connected receiver that
was garbage-collected without telling anyone, so its stages stay listened
(events are still built, for nobody).  Disconnect receivers explicitly, or
connect them with ``weak=False``.

Thread safety: connections are counted under a lock, and the answer is
replaced, never changed in place, so the emit path reads it without one.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Hashable
from typing import Any

from blinker import ANY, NamedSignal

from .process import PROCESS


class _EveryStage:
    """The record's value when some receiver takes every stage (blinker's ``ANY``)."""

    __slots__ = ()

    def __contains__(self, stage: object) -> bool:
        return True

    def __repr__(self) -> str:
        return "EVERY_STAGE"


EVERY_STAGE = _EveryStage()


class _Listeners:
    """The stages something receives: ``stage in listeners.stages``.

    ``stages`` is a frozenset of stage names, or :data:`EVERY_STAGE`.  It is
    replaced, never changed in place, so a reader on any thread sees one
    whole value without a lock; a stage sent while a receiver is being
    connected on another thread may miss it, as it would a moment earlier.

    ``emits_stage`` wrappers read this object as a global, and cloudpickle
    copies a wrapper's globals by value when it pickles a worker class
    defined in a function (Ray does, for verl's colocated ``WorkerDict``): a
    copy would answer for the wrong process.  This object therefore pickles
    as a reference to this module's one instance.
    """

    __slots__ = ("stages",)

    def __init__(self) -> None:
        self.stages: frozenset[str] | _EveryStage = frozenset()

    def __reduce__(self) -> str:
        return "listeners"


listeners = _Listeners()

# The record, (signal name, receiver key) -> the stage names (or ANY) it is connected for,
# is PROCESS.connections.
_connections_lock = threading.Lock()


def _receiver_key(receiver: Callable[..., Any]) -> Hashable:
    # As blinker tells receivers apart: a bound method is made anew on each
    # attribute access, so it is its object and its function.
    if inspect.ismethod(receiver):
        return (id(receiver.__self__), id(receiver.__func__))
    return id(receiver)


def _publish() -> None:
    """Replace ``listeners.stages`` from the connections (lock held)."""
    names: set[str] = set()
    for senders in PROCESS.connections.values():
        if ANY in senders:
            listeners.stages = EVERY_STAGE
            return
        names.update(senders)
    listeners.stages = frozenset(names)


def _on_receiver_connected(signal: Any, *, receiver: Callable[..., Any], sender: Any, **_: Any) -> None:
    # Stages are sent with their name as sender, so any other sender never matches.
    if sender is not ANY and not isinstance(sender, str):
        return
    with _connections_lock:
        PROCESS.connections.setdefault((signal.name, _receiver_key(receiver)), set()).add(sender)
        _publish()


def _on_receiver_disconnected(signal: Any, *, receiver: Callable[..., Any], sender: Any, **_: Any) -> None:
    key = (signal.name, _receiver_key(receiver))
    with _connections_lock:
        senders = PROCESS.connections.get(key)
        if senders is None:
            return
        if sender is ANY:  # blinker: disconnect from every sender
            del PROCESS.connections[key]
        else:
            senders.discard(sender)
            if not senders:
                del PROCESS.connections[key]
        _publish()


def follow(*signals: NamedSignal) -> None:
    """Keep the record for these signals; call before anything connects to them."""
    for signal in signals:
        signal.receiver_connected.connect(_on_receiver_connected, weak=False)
        signal.receiver_disconnected.connect(_on_receiver_disconnected, weak=False)
