"""The weights a sync sends, as they pass from the trainer to the rollout engine.

verl hands the sync's tensors as a generator of ``(name, tensor)`` pairs,
each one made when it is asked for and dropped once it was sent: to a
rollout adapter (``update_weights(weights, ...)``, the ``naive`` engine) or
to a checkpoint engine on the trainer's ranks (``send_weights(weights, ...)``,
every other engine).  The verl bridge passes that generator through
:func:`passing`, so a watcher (the ``weight_sync`` observer) sees every pair
on its way without holding the payload: each pair is shown to the watchers,
then handed on unchanged.  What is no iterable of pairs (verl's delta engine
is handed the training engine itself) is handed on untouched, and the
watchers that have an ``unseen(payload, why)`` hook are told why they saw nothing.

With no watcher, :func:`passing` returns the generator itself: the sync
costs nothing more.  A watcher that raises is logged and left out for the
rest of that sync; the sync goes on.  Standard library only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from verl_events.events.process import PROCESS

__all__ = ["Payload", "PayloadWatcher", "passing", "unwatch_payloads", "watch_payloads"]

logger = logging.getLogger("verl_events.weights")


@dataclass(frozen=True, slots=True)
class Payload:
    """What a sync says about itself besides its tensors.

    ``step`` is verl's ``global_steps`` (None when the caller gave none);
    ``adapter`` is True when the sync carries a LoRA ``peft_config``, that
    is, when adapter tensors are expected; ``seen_at`` names the call the
    tensors were seen passing; ``loaded_on_return`` is False where the engine
    loads them in another process, maybe after the call returned (a
    checkpoint engine's send), so that what the engine holds when the call
    returns says nothing about this sync.
    """

    step: int | None
    adapter: bool
    seen_at: str = "the rollout adapter's update_weights"
    loaded_on_return: bool = True


class PayloadWatcher(Protocol):
    """Sees one sync's tensors: ``began``, then ``tensor`` once per pair, then ``ended``
    (``complete`` False when the sender stopped before the last pair).  A watcher may also
    have ``unseen(payload, why)``: a sync whose tensors cannot be seen where it passes."""

    def began(self, payload: Payload) -> None: ...

    def tensor(self, name: str, tensor: Any) -> None: ...

    def ended(self, payload: Payload, complete: bool) -> None: ...


_lock = threading.Lock()


def watch_payloads(watcher: PayloadWatcher) -> None:
    """Show every sync from now on to ``watcher``."""
    with _lock:
        if watcher not in PROCESS.payload_watchers:
            PROCESS.payload_watchers.append(watcher)


def unwatch_payloads(watcher: PayloadWatcher) -> None:
    with _lock:
        if watcher in PROCESS.payload_watchers:
            PROCESS.payload_watchers.remove(watcher)


def passing(weights: Any, payload: Payload) -> Any:
    """``weights`` (an iterable or async iterable of ``(name, tensor)``), shown to the watchers as it passes."""
    with _lock:
        watchers: list[PayloadWatcher] = list(PROCESS.payload_watchers)
    if not watchers:
        return weights
    # A sender that reads with a plain ``for`` gets a plain generator back, whatever else it is.
    if isinstance(weights, Iterable) and not isinstance(weights, str | bytes):
        return _passing(weights, payload, watchers)
    if isinstance(weights, AsyncIterable):
        return _passing_async(weights, payload, watchers)
    why = (
        f"{payload.seen_at} was handed a {type(weights).__name__}, not (name, tensor) pairs: the engine reads "
        "the weights itself, where no tensor passes a point this process watches"
    )
    for watcher in watchers:
        if hasattr(watcher, "unseen"):
            _Showing._call(watcher, "unseen", payload, why)
    return weights


def _passing(weights: Iterable[tuple[str, Any]], payload: Payload, watchers: list[PayloadWatcher]) -> Iterator[Any]:
    showing = _Showing(payload, watchers)
    complete = False
    try:
        for pair in weights:
            showing.tensor(pair)
            yield pair
        complete = True
    finally:
        showing.ended(complete)


async def _passing_async(
    weights: AsyncIterable[tuple[str, Any]], payload: Payload, watchers: list[PayloadWatcher]
) -> AsyncIterator[Any]:
    showing = _Showing(payload, watchers)
    complete = False
    try:
        async for pair in weights:
            showing.tensor(pair)
            yield pair
        complete = True
    finally:
        showing.ended(complete)


class _Showing:
    """One sync shown to its watchers; a watcher that raises is dropped from it."""

    def __init__(self, payload: Payload, watchers: list[PayloadWatcher]) -> None:
        self.payload = payload
        self.watchers = [w for w in watchers if self._call(w, "began", payload)]

    def tensor(self, pair: Any) -> None:
        try:
            name, tensor = pair
        except (TypeError, ValueError):
            return  # not a (name, tensor) pair: the sender's business, not ours
        if not isinstance(name, str) or not hasattr(tensor, "shape"):
            return  # a pair of something else (a delta engine's flush and its is_last flag)
        self.watchers = [w for w in self.watchers if self._call(w, "tensor", name, tensor)]

    def ended(self, complete: bool) -> None:
        for watcher in self.watchers:
            self._call(watcher, "ended", self.payload, complete)

    @staticmethod
    def _call(watcher: PayloadWatcher, hook: str, *args: Any) -> bool:
        try:
            getattr(watcher, hook)(*args)
        except Exception:  # a watcher must never stop the sync
            logger.exception(
                "verl_events: %r failed in %s of the weight sync; it sees no more of this sync", watcher, hook
            )
            return False
        return True
