"""The dispatcher that gives the bus's signals their guarantees.

Every stage is announced on two blinker signals (:mod:`verl_events.events.signals`),
with the stage name as blinker's *sender* and the event as the ``event``
keyword::

    stage_begin.send("actor_update", event=StageEvent(...))
    stage_end.send("actor_update", event=StageEnd(...))

Any blinker receiver may subscribe (``stage_begin.connect(fn)``, for all
stages, or ``connect(fn, sender="actor_update")`` for one); it gets
blinker's own semantics: unordered, and an exception propagates into the
training loop.  Observers get more: :func:`verl_events.install` connects one
:class:`Dispatcher` (strongly referenced; blinker's default weak reference
would silently drop an observer built from config), and the dispatcher
delivers to its observers in a fixed order, isolates their failures and
pairs every begin with one end.  It subscribes with the selected stage names
as senders, so blinker itself skips stages no observer selected.

Which stages anything receives, dispatchers and plain receivers of either
signal alike, is recorded in :mod:`verl_events.events.listened`; the emit path
reads that record and nothing else before deciding to build an event.

It also delivers the ``anomaly`` and ``hang`` signals to the observers'
``on_anomaly`` / ``on_hang`` hooks (:mod:`verl_events.bus.alerts`), with the
stage hooks' guarantees.

Two things happen in :meth:`Dispatcher.on_begin` before any selection is
looked at, each a named step: the step-boundary agreement of armed capture
(:meth:`~verl_events.capture.arming.TriggerClock.advance`, a collective when there
are several ranks), and, at the first stage a writing observer receives, the
installation's claim on its save_path (:class:`~verl_events.run.claim.SavePathClaim`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from blinker import ANY

from verl_events.capture.arming import ArmedSelection
from verl_events.events.anomaly import AnomalyEvent, anomaly
from verl_events.events.errors import ObserverError
from verl_events.events.hang import HangEvent, hang
from verl_events.events.observer import Observer
from verl_events.events.signals import stage_begin, stage_end
from verl_events.events.stages import DRIVER_RANK, StageEnd, StageEvent, StageReport
from verl_events.run.identity import SavePathTaken

from .alerts import Alert, defines_hook, hears
from .dispatch_warnings import warn_model_missing, warn_ranks_outside, warn_step_unknown
from .stack import ask_for_result, open_stages

if TYPE_CHECKING:
    from verl_events.capture.arming import TriggerClock
    from verl_events.capture.replay import ReplayPlan
    from verl_events.run.claim import SavePathClaim

logger = logging.getLogger("verl_events")


@dataclass(slots=True, eq=False)  # frames are told apart by identity
class _Frame:
    """One open stage: who got its begin, and their hook times so far."""

    delivered: list[Observer] = field(default_factory=list)
    begin_seconds: dict[str, float] = field(default_factory=dict)
    end_seconds: dict[str, float] = field(default_factory=dict)
    enclosing: tuple[str, ...] = ()  # observers of the open stages around this one


def _around(inner: _Frame | None) -> tuple[str, ...]:
    """Observers that hold the open stage ``inner``, or one around it."""
    if inner is None:
        return ()
    return tuple(dict.fromkeys(inner.enclosing + tuple(o.name for o in inner.delivered if not o.passive)))


class Dispatcher:
    """Delivers stage events to a fixed, ordered set of observers.

    * Begin hooks run by descending priority, then in the given order, with
      capture observers (``captures``) after all others; end hooks run in
      the reverse order of the begins actually delivered.
    * An observer whose begin hook was called gets exactly one end hook,
      even if its own begin raised.
    * A hook raising ``Exception`` is logged (observer, hook, stage, step,
      rank, error) and the others still run.  In strict mode the first
      failure raises :class:`ObserverError` once every owed end hook ran.
      ``KeyboardInterrupt`` and ``SystemExit`` always propagate.
    * After ``max_failures`` failures an observer is switched off for the
      rest of the run, with one message; it still gets the ends it is owed.
    * Hook times are measured only when some observer ``wants_timings``.
    * When an observer it delivered a begin to ``wants_result``, it asks
      the emitter (:func:`ask_for_result`) to put the stage's result and
      inputs on the end event that every receiver gets.
    * ``on_anomaly`` / ``on_hang`` hooks get the ``anomaly`` and ``hang``
      signals, in begin order, for what their selection accepts (stage,
      step, rank), on the sender's thread; failures are isolated, counted
      and strict as for stage hooks, and in strict mode the first one
      raises ObserverError to the sender once every observer heard it.
    * ``clock``: armed capture's step-boundary agreement runs at every
      begin with a step, before any selection is looked at; it and
      ``plan`` (replay) note each anomaly before any observer hears it.
    * ``claim``: made before the first begin delivered to one of its
      writers; when another run holds the save_path, those writers are
      switched off for the rest of the run with one message (strict: the
      stage raises ObserverError).

    Thread safety: the observer tuple never changes after construction and
    open stages are keyed by the event's unique ``seq``, so stages on
    several threads do not interfere.
    """

    def __init__(
        self,
        observers: Sequence[Observer],
        *,
        strict: bool,
        max_failures: int | None = None,
        clock: TriggerClock | None = None,
        claim: SavePathClaim | None = None,
        plan: ReplayPlan | None = None,
    ) -> None:
        # Captures innermost, then by priority; sorted() is stable, so equal
        # priorities keep install order.
        self.observers: tuple[Observer, ...] = tuple(sorted(observers, key=lambda o: (o.captures, -o.priority)))
        self.strict = strict
        self._timed = any(o.wants_timings for o in self.observers)
        self._results_wanted = any(o.wants_result for o in self.observers)
        self._by_stage: dict[str, tuple[Observer, ...]] = {}
        self._open: dict[int, _Frame] = {}
        self.max_failures = max_failures
        self._failures: dict[str, int] = {}
        self._switched_off: set[str] = set()
        self._model_warned: set[tuple[str, str | None]] = set()
        self._step_warned: set[str] = set()
        self._ranks_warned: set[str] = set()
        self._clock = clock
        self._plan = plan
        self._anomaly_hooks = tuple(o for o in self.observers if defines_hook(o, "on_anomaly"))
        self._hang_hooks = tuple(o for o in self.observers if defines_hook(o, "on_hang"))
        self._claim = claim if claim is not None and claim.writers else None  # None once made
        self._claim_lock = threading.Lock()

    # -- subscription -------------------------------------------------------

    def connect(self) -> None:
        """Subscribe to both stage signals, only for stages some observer
        selects; to ``anomaly`` and ``hang`` when anything here hears them."""
        senders: set[Any] = set()
        for observer in self.observers:
            if observer.selection.stages is None:
                senders = {ANY}
                break
            senders |= observer.selection.stages
        for sender in senders:
            stage_begin.connect(self.on_begin, sender=sender, weak=False)
            stage_end.connect(self.on_end, sender=sender, weak=False)
        if self._anomaly_hooks or self._clock is not None or self._plan is not None:
            anomaly.connect(self.on_anomaly, weak=False)
        if self._hang_hooks:
            hang.connect(self.on_hang, weak=False)

    def disconnect(self) -> None:
        """Unsubscribe from every signal; stages no other receiver takes go
        back to the disabled path."""
        stage_begin.disconnect(self.on_begin)
        stage_end.disconnect(self.on_end)
        anomaly.disconnect(self.on_anomaly)
        hang.disconnect(self.on_hang)

    # -- dispatch -----------------------------------------------------------

    def on_begin(self, sender: str, *, event: StageEvent) -> None:
        """Deliver the begin to the observers that select it, in order."""
        if self._clock is not None and event.step is not None:
            self._clock.advance(event.step)  # the step boundary: may run a collective
        candidates = self._by_stage.get(event.stage)
        if candidates is None:  # the first stage of this name: the one place to look at the world's ranks
            candidates = self._candidates(event.stage)
            warn_ranks_outside(event, self.observers, self._ranks_warned)
        if event.step is None and event.stage not in self._step_warned:
            warn_step_unknown(event, candidates, self._step_warned)
        if event.replay:  # only armed observers and those that ask see a replay
            candidates = tuple(o for o in candidates if o.sees_replays or isinstance(o.selection, ArmedSelection))
        if event.rank == DRIVER_RANK:  # only observers that ask see the driver's stages
            candidates = tuple(o for o in candidates if o.sees_driver)
        selected = [o for o in candidates if o.selection.accepts(event) and o.name not in self._switched_off]
        claim = self._claim  # read once: another thread may make it and clear it meanwhile
        if claim is not None and selected:
            selected = self._claim_for(claim, selected, event)
        if not selected:
            return
        if event.model is None and any(o.needs_model for o in selected):
            warn_model_missing(event, selected, self._model_warned)
        frame = _Frame()
        if self._timed:
            frame.enclosing = _around(self._enclosing_frame(event))
        self._open[event.seq] = frame
        for observer in selected:
            frame.delivered.append(observer)
            error = self._call(observer, "on_stage_begin", observer.on_stage_begin, event, frame.begin_seconds)
            if error is not None and self.strict:
                # The emitter answers with stage_end, which closes this frame.
                raise _strict_error(observer, "on_stage_begin", event, "stops the stage") from error
        if self._results_wanted:
            for observer in selected:  # a loop: any() with a generator costs ~4x more
                if observer.wants_result:
                    ask_for_result(event.seq)
                    break

    def _claim_for(self, claim: SavePathClaim, selected: list[Observer], event: StageEvent) -> list[Observer]:
        """Make the save_path claim if a writer is about to get its first stage;
        the observers that may go on."""
        if not any(o.name in claim.writer_names for o in selected):
            return selected
        with self._claim_lock:
            if self._claim is None:  # another thread made it meanwhile
                return [o for o in selected if o.name not in self._switched_off]
            try:
                claim.make()
            except (SavePathTaken, OSError) as exc:  # another run's, or a save_path that cannot be written
                self._switched_off |= claim.writer_names
                names = ", ".join(repr(o.name) for o in claim.writers)
                logger.error(
                    "%s. Observer(s) %s write nothing in this run (switched off at stage %r, step %s, rank %s), "
                    "so that two runs never mix",
                    exc,
                    names,
                    event.stage,
                    event.step,
                    event.rank,
                )
                if self.strict:
                    raise ObserverError(
                        f"observer(s) {names} cannot write to their save_path: {exc}; strict mode stops the stage"
                    ) from exc
            finally:
                self._claim = None
        return [o for o in selected if o.name not in self._switched_off]

    def on_end(self, sender: str, *, event: StageEnd) -> None:
        frame = self._open.pop(event.seq, None)
        if frame is None:  # nobody selected this stage, or installed mid-stage
            return
        first: tuple[Observer, BaseException] | None = None
        for observer in reversed(frame.delivered):
            error = self._call(observer, "on_stage_end", observer.on_stage_end, event, frame.end_seconds)
            if error is not None and first is None:
                first = (observer, error)
        hook = "on_stage_end"
        if self._timed:
            reported = self._report(event, frame)
            if first is None and reported is not None:
                first, hook = reported, "on_stage_report"
        if first is not None and self.strict:
            raise _strict_error(first[0], hook, event, "stops the stage") from first[1]

    def on_anomaly(self, sender: Any, *, event: AnomalyEvent) -> None:
        """Note the anomaly for armed capture and replay, then deliver it to
        the ``on_anomaly`` hooks."""
        if self._clock is not None:
            self._clock.on_anomaly(event)
        if self._plan is not None:
            self._plan.on_anomaly(event)
        self._deliver("on_anomaly", self._anomaly_hooks, event)

    def on_hang(self, sender: Any, *, event: HangEvent) -> None:
        """Deliver a hang to the ``on_hang`` hooks, on the watchdog's thread."""
        self._deliver("on_hang", self._hang_hooks, event)

    def _deliver(self, hook_name: str, hearing: tuple[Observer, ...], event: Alert) -> None:
        first: tuple[Observer, BaseException] | None = None
        for observer in hearing:
            if observer.name in self._switched_off or not hears(observer, event):
                continue
            error = self._call(observer, hook_name, getattr(observer, hook_name), event, None)
            if error is not None and first is None:
                first = (observer, error)
        if first is not None and self.strict:
            raise _strict_error(first[0], hook_name, event, "raises it to the signal's sender") from first[1]

    def _report(self, event: StageEnd, frame: _Frame) -> tuple[Observer, BaseException] | None:
        """Give the timing-capable observers the stage's hook times; the first failure, if any."""
        begin, end = frame.begin_seconds, frame.end_seconds
        report = StageReport(
            event=event,
            observers=tuple(o.name for o in frame.delivered),
            passive=frozenset(o.name for o in frame.delivered if o.passive),
            hook_seconds=MappingProxyType(
                {name: begin.get(name, 0.0) + end.get(name, 0.0) for name in begin.keys() | end.keys()}
            ),
            begin_seconds=MappingProxyType(begin),
            end_seconds=MappingProxyType(end),
            enclosing=frame.enclosing,
        )
        first: tuple[Observer, BaseException] | None = None
        for observer in frame.delivered:
            if observer.wants_timings:
                error = self._call(observer, "on_stage_report", observer.on_stage_report, report, None)
                if error is not None and first is None:
                    first = (observer, error)
        return first

    def _call(
        self,
        observer: Observer,
        hook_name: str,
        hook: Callable[[Any], None],
        payload: Any,
        seconds: dict[str, float] | None,
    ) -> Exception | None:
        timed = self._timed and seconds is not None
        started = perf_counter() if timed else 0.0
        try:
            hook(payload)
        except Exception as exc:  # BaseException (Ctrl-C, exit) must propagate
            self._log_failure(observer, hook_name, payload, exc)
            return exc
        finally:
            if timed:
                assert seconds is not None
                seconds[observer.name] = perf_counter() - started
        return None

    def _enclosing_frame(self, event: StageEvent) -> _Frame | None:
        """The frame of the innermost open stage around ``event`` on this
        thread that this dispatcher delivered; None at top level."""
        for outer in reversed(open_stages()):
            if outer.seq != event.seq:
                frame = self._open.get(outer.seq)
                if frame is not None:
                    return frame
        return None

    def _candidates(self, stage: str) -> tuple[Observer, ...]:
        found = self._by_stage.get(stage)
        if found is None:
            found = tuple(o for o in self.observers if o.selection.stages is None or stage in o.selection.stages)
            self._by_stage[stage] = found
        return found

    def _log_failure(self, observer: Observer, hook_name: str, payload: Any, exc: Exception) -> None:
        event = payload.event if isinstance(payload, StageReport) else payload
        count = self._failures.get(observer.name, 0) + 1
        self._failures[observer.name] = count
        # The first failure carries the traceback; repeats stay one line.
        logger.error(
            "observer %r failed in %s for stage %r (step %s, rank %s): %s: %s%s",
            observer.name,
            hook_name,
            event.stage,
            event.step,
            event.rank,
            type(exc).__name__,
            exc,
            "" if count == 1 else f" (failure {count})",
            exc_info=exc if count == 1 else None,
        )
        if count == self.max_failures:
            self._switched_off.add(observer.name)
            logger.error(
                "observer %r failed %d times; it is switched off for the rest of this run "
                "(raise max_failures, or set it to null, to keep it on)",
                observer.name,
                count,
            )


def _strict_error(observer: Observer, hook_name: str, event: StageEvent | Alert, outcome: str) -> ObserverError:
    return ObserverError(
        f"observer {observer.name!r} failed in {hook_name} for stage {event.stage!r} "
        f"(step {event.step}, rank {event.rank}); strict mode {outcome}. "
        "Set strict: false to log observer failures and keep training."
    )
