"""Emitting stages: the ``stage`` context manager and the ``emits_stage`` decorator.

When no receiver listens for a stage, both cost one set lookup in the bus's
record of listened stages (``_listened.listeners``) and call the body directly;
nothing is resolved or allocated.

Results: when an observer that received a stage's begin sets
``wants_result``, the end event carries the stage's return value
(``result``) and its first data argument (``inputs``), by reference.
Otherwise both stay None and nothing is looked up for them.

Nesting and threads: each thread keeps its own stack of open stages
(:mod:`verl_events.bus.stack`, which the dispatcher reads too), so a stage
inside another gets ``depth`` 1 and ``parent`` set, and stages on two
threads never see each other's stack.  Begin and end events share a
process-unique ``seq``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from time import perf_counter
from types import MappingProxyType, TracebackType
from typing import Any, ParamSpec, TypeVar

from verl_events.capture.replay import active as active_replay_plan
from verl_events.capture.replay import replayable as replayable_stage
from verl_events.events.listened import listeners as _listeners
from verl_events.events.process import PROCESS
from verl_events.events.signals import stage_begin, stage_end
from verl_events.events.stages import DRIVER_RANK, EMPTY_META, STAGE_ROLES, StageEnd, StageEvent, check_stage_name

from .resolve import check_step, current_step, find_model, find_rank, find_step
from .stack import open_stages, result_asked

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

logger = logging.getLogger("verl_events")


def _new_event(
    name: str,
    role: str | None,
    step: int | None,
    model: Any,
    meta: dict[str, Any],
    model_paths: tuple[str, ...],
    rank: int | None = None,
) -> StageEvent:
    stack = open_stages()
    found_rank, world_size = find_rank()
    if rank is None:
        rank = found_rank
    return StageEvent(
        stage=name,
        role=role,
        step=step,
        rank=rank,
        world_size=world_size,
        model=model,
        meta=MappingProxyType(meta) if meta else EMPTY_META,
        depth=len(stack),
        parent=stack[-1].stage if stack else None,
        seq=next(PROCESS.seq),
        model_paths=model_paths,
    )


def _open(event: StageEvent) -> tuple[float, bool]:
    """Send stage_begin; return the body's start time and whether a receiver
    asked for the stage's result.  If a begin receiver raises (strict mode,
    Ctrl-C), stage_end still goes out before the error propagates, so every
    observer that began also ends."""
    stack = open_stages()
    stack.append(event)
    try:
        stage_begin.send(event.stage, event=event)
    except BaseException as exc:
        stack.pop()
        result_asked(event.seq)  # forget a question asked before the failure
        _send_end(event.ended(0.0, exc), body_failed=True)
        raise
    return perf_counter(), result_asked(event.seq)


def _close(
    event: StageEvent,
    started: float,
    error: BaseException | None,
    result: Any = None,
    inputs: Any = None,
) -> None:
    elapsed = perf_counter() - started
    open_stages().pop()
    _send_end(event.ended(elapsed, error, result, inputs), body_failed=error is not None)


def _first_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A method's first data argument: the first positional one after self,
    else the first keyword argument's value, else None."""
    if len(args) > 1:
        return args[1]
    for value in kwargs.values():
        return value
    return None


def _send_end(end: StageEnd, *, body_failed: bool) -> None:
    if not body_failed:
        stage_end.send(end.stage, event=end)
        return
    # The body's own exception must propagate unchanged: a failing end
    # receiver is logged instead of replacing it.
    try:
        stage_end.send(end.stage, event=end)
    except Exception:
        logger.exception("stage_end receiver failed while stage %r was already failing", end.stage)


def _run(event: StageEvent, fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    """Run a stage's body between its begin and end events; its exception
    propagates unchanged, after the end event."""
    started, wants_result = _open(event)
    inputs = _first_input(args, kwargs) if wants_result else None
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        _close(event, started, exc, None, inputs)
        raise
    _close(event, started, None, result if wants_result else None, inputs)
    return result


def _replay(event: StageEvent, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Run the stage's body once more as a replay (``replay=True``), for the
    armed capture observers; its result is dropped, and an exception it
    raises is logged, never raised."""
    logger.info("replaying stage %r of step %s on rank %d for the armed observers", event.stage, event.step, event.rank)
    try:
        _run(dataclasses.replace(event, seq=next(PROCESS.seq), replay=True), fn, args, kwargs)
    except Exception as exc:
        logger.error(
            "the replay of stage %r (step %s, rank %d) raised %s: %s; training goes on with the stage's own result",
            event.stage,
            event.step,
            event.rank,
            type(exc).__name__,
            exc,
        )


class stage:
    """Context manager that emits ``stage_begin`` / ``stage_end`` around a block.

    ``with stage("actor_update", role="actor", step=3, model=m) as event: ...``

    ``role`` defaults to the role verl runs the stage in; ``step`` to the
    step announced with :func:`set_step`; ``rank`` to the process's own
    (torch.distributed, env ``RANK``, 0): a process that works for another
    rank, like a rollout server prefilling one trainer rank's sequences,
    names that rank, and verl's driver names :data:`DRIVER_RANK`.  A ``step`` follows set_step's
    rule (a non-negative int, numpy and 0-d tensor ints included, or None):
    anything else raises ValueError with set_step's sentence when the stage
    is entered and something listens.  Extra keywords become
    ``event.meta``.  ``event`` is the :class:`StageEvent`, or None when no
    receiver listens for this stage.  The block runs exactly once and its
    exception propagates unchanged.  Use a fresh object for each ``with``.

    Results, for observers that set ``wants_result``: ``inputs=`` names the
    stage's input, and :meth:`set_result`, called on this object before the
    block ends, hands over its output; both travel by reference on the end
    event (``StageEnd.inputs`` / ``StageEnd.result``)::

        update = stage("actor_update", step=3, inputs=batch)
        with update:
            output = update.set_result(train(batch))

    When no observer that got the begin wants results, both stay None on the
    end event; ``set_result`` then only returns its argument.  When the block
    raises, ``result`` is None whatever was set.
    """

    __slots__ = (
        "_name",
        "_role",
        "_step",
        "_model",
        "_rank",
        "_meta",
        "_inputs",
        "_event",
        "_started",
        "_wants_result",
        "_result",
    )

    def __init__(
        self,
        name: str,
        *,
        role: str | None = None,
        step: int | None = None,
        model: Any = None,
        inputs: Any = None,
        rank: int | None = None,
        **meta: Any,
    ) -> None:
        if rank is not None and (
            isinstance(rank, bool) or not isinstance(rank, int) or (rank < 0 and rank != DRIVER_RANK)
        ):
            raise ValueError(
                f"stage {name!r}: rank {rank!r} is not allowed; use an integer >= 0, "
                f"DRIVER_RANK ({DRIVER_RANK}) in verl's driver, or None"
            )
        self._name = name
        self._role = role
        self._step = step
        self._model = model
        self._rank = rank
        self._meta = meta
        self._inputs = inputs
        self._event: StageEvent | None = None
        self._started = 0.0
        self._wants_result = False
        self._result: Any = None

    def __enter__(self) -> StageEvent | None:
        if self._name not in _listeners.stages:
            return None
        name = check_stage_name(self._name)
        role = self._role if self._role is not None else STAGE_ROLES.get(name)
        step = check_step(self._step, "stage", name) if self._step is not None else current_step()
        event = _new_event(name, role, step, self._model, self._meta, (), self._rank)
        self._started, self._wants_result = _open(event)
        self._event = event
        return event

    def set_result(self, result: T) -> T:
        """Hand the stage's output to observers that want it; return it unchanged.

        Call inside the ``with`` block; kept (by reference) only while the
        stage is open and an observer asked for results, else ignored.
        """
        if self._wants_result:
            self._result = result
        return result

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        event, self._event = self._event, None
        if event is None:
            return
        wanted, self._wants_result = self._wants_result, False
        result, self._result = self._result, None  # set only when wanted
        _close(event, self._started, exc, result if exc is None else None, self._inputs if wanted else None)


def emits_stage(
    name: str, *, role: str | None = None, replayable: bool | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a worker method so that each call is a stage.

    Like verl's ``DistProfiler.annotate(role=...)``.  On each call where
    something listens, it resolves the step (argument ``meta_info`` or dict
    ``"global_steps"``, worker ``global_step`` / ``_global_step``, then
    :func:`set_step`; a value set_step would refuse is passed over), the
    rank (torch.distributed, env ``RANK``, 0) and the model (per-role
    attribute paths on the worker, see :func:`add_model_paths`).  The
    method runs exactly once per call and its exception propagates unchanged.

    When an observer that got the begin sets ``wants_result``, the end event
    carries the method's return value as ``result`` (None when it raised)
    and its first argument after ``self`` as ``inputs`` (else the first
    keyword argument's value, else None), by reference.

    ``replayable``: whether the method may run again right after a call that
    raised an anomaly, for the armed capture observers (see
    :mod:`verl_events.capture.replay`); by default verl's forward-only stages are,
    and no other.  Declare it only for a method that changes no state: the
    replay runs it once more with the same arguments, and its result is
    thrown away.
    """
    check_stage_name(name, where="emits_stage")
    stage_role = role if role is not None else STAGE_ROLES.get(name)
    replays = replayable_stage(name, replayable)

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        method_meta = {"method": fn.__qualname__}

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            if name not in _listeners.stages:
                # Calling without an empty **kwargs saves ~20 ns on the common path.
                return fn(*args, **kwargs) if kwargs else fn(*args)  # type: ignore[call-arg]
            worker = args[0] if args else None
            step = find_step(worker, args[1:], kwargs)
            model, paths = find_model(worker, stage_role)
            event = _new_event(name, stage_role, step, model, dict(method_meta), paths)
            result = _run(event, fn, args, kwargs)
            plan = active_replay_plan()
            if replays and plan is not None and plan.agrees(name, event.step):
                _replay(event, fn, args, kwargs)
            return result

        return wrapper

    return decorate
