"""verl's transitions as stages: the weight sync, the rollout's wake-up, checkpoints.

verl runs these between its compute stages and marks none of them with
``DistProfiler.annotate``; :mod:`verl_events.verl_bridge` wraps the methods
below, in the trainer's rank processes that run them, with the wrappers built here.

| stage | method wrapped | process | step |
| --- | --- | --- | --- |
| ``update_weights`` | the actor worker's ``update_weights(global_steps=N)`` | every trainer rank | N |
| ``rollout_wake_up`` | the rollout adapter's ``resume(tags)`` (inside the sync) | every trainer rank | the sync's N |
| (none) | the rollout adapter's ``update_weights(weights, ...)`` (in the sync) | every trainer rank | the sync's N |
| (none) | a checkpoint engine's ``send_weights(weights, ...)`` (in the sync) | every trainer rank | the sync's N |
| ``save_checkpoint`` | a worker's ``save_checkpoint(..., global_step=N)`` | every trainer rank | N |
| ``load_checkpoint`` | a worker's ``load_checkpoint(".../global_step_N/...")`` | every trainer rank | N |

A sync, a save or a load carries the step whose weights it moves; the
wake-up, the sync's.  The adapter's ``update_weights`` is no stage of its
own: its ``weights`` pass through :func:`verl_events.bus.weights.passing`, so
that the ``weight_sync`` observer sees each tensor the sync sends.  So do a
checkpoint engine's: every engine but ``naive`` (verl's separate_async
trainer, nccl, nixl, …) sends from the trainer's ranks through
``send_weights`` and runs the adapter in the rollout's own process.  A delta
flush (``wire_format="delta_flush"``) is a patch, not parameters: the
adapter's tap hands it on unwatched.

The rollout's sleep is not here: verl 0.9.1's driver sends it straight to
the rollout servers (``CheckpointEngineManager.sleep_replicas``), and
neither process is a trainer rank.  Stages there would be filed under rank
0, whose per-rank files (heartbeats, crash records) belong to the trainer's
rank 0 process: measured on the CPU trainer, the driver's heartbeat replaced
rank 0's.

verl's actor worker calls the inner training worker's save and load, so a
save inside a save (on one thread) is one stage, not two.  Async methods
stay async (Ray and verl decide from that how to call them); their stage
is open on the event loop's thread while the method is awaited, which holds
because verl awaits one transition at a time in a worker.

The wrappers only call module-level functions: Ray pickles worker classes
by value, and with them whatever a wrapper's code names.  Nothing here may
stop training: a step verl passes that is not a step is passed over.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

from verl_events.bus.emit import stage
from verl_events.bus.resolve import check_step, find_model
from verl_events.bus.stack import open_stages
from verl_events.bus.weights import Payload, passing
from verl_events.events.errors import ConfigError

WEIGHT_SYNC = "update_weights"
ROLLOUT_WAKE_UP = "rollout_wake_up"
SAVE_CHECKPOINT = "save_checkpoint"
LOAD_CHECKPOINT = "load_checkpoint"

_CHECKPOINT_STEP = re.compile(r"global_step_(\d+)")


def step_or_none(value: Any) -> int | None:
    """``value`` if it is a step the bus accepts, else None (never raises)."""
    try:
        return check_step(value, "verl bridge")
    except (ValueError, TypeError, ConfigError):
        return None


def argument(method: Callable[..., Any], name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """A reader of one argument of ``method``'s calls (None when absent or unbindable)."""
    signature = inspect.signature(method)

    def read(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return None  # the call itself will raise
        bound.apply_defaults()
        return bound.arguments.get(name)

    return read


def checkpoint_step(local_path: Any) -> int | None:
    """The N of the last ``global_step_N`` in a checkpoint path, else None."""
    found = _CHECKPOINT_STEP.findall(str(local_path)) if local_path is not None else []
    return int(found[-1]) if found else None


def nested_in_itself(name: str) -> bool:
    """Whether the innermost stage open on this thread is ``name``."""
    stack = open_stages()
    return bool(stack) and stack[-1].stage == name


def weight_sync(
    update_weights: Callable[..., Any],
    before: Callable[[int | None], None],
    after: Callable[[int | None], None],
) -> Callable[..., Any]:
    """The worker's ``update_weights(global_steps=N, ...)`` as the ``update_weights`` stage of step N.

    The stage's model is the worker's actor model, whose weights the sync sends.
    ``before(N)`` runs first (what runs inside the sync belongs to step N),
    ``after(N)`` once it returned (the stages that follow belong to N + 1);
    ``after(None)`` when it raised.
    """
    global_steps = argument(update_weights, "global_steps")

    if inspect.iscoroutinefunction(update_weights):

        @functools.wraps(update_weights)
        async def sync_async(*args: Any, **kwargs: Any) -> Any:
            step = step_or_none(global_steps(args, kwargs))
            before(step)
            done: int | None = None
            try:
                with stage(WEIGHT_SYNC, role="actor", step=step, model=_actor_model(args)):
                    result = await update_weights(*args, **kwargs)
                done = step
            finally:
                after(done)
            return result

        return sync_async

    @functools.wraps(update_weights)
    def sync(*args: Any, **kwargs: Any) -> Any:
        step = step_or_none(global_steps(args, kwargs))
        before(step)
        done: int | None = None
        try:
            with stage(WEIGHT_SYNC, role="actor", step=step, model=_actor_model(args)):
                result = update_weights(*args, **kwargs)
            done = step
        finally:
            after(done)
        return result

    return sync


def _actor_model(args: tuple[Any, ...]) -> Any:
    """The worker's actor model (what the sync sends), found as for the actor's compute stages."""
    return find_model(args[0], "actor")[0] if args else None


def checkpoint(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """A worker's ``save_checkpoint`` / ``load_checkpoint`` as the stage ``name``, with the
    step of the checkpoint (``global_step``, or the ``global_step_N`` in ``local_path``) and
    ``meta["path"]``, the checkpoint's folder (``local_path`` as text; None when not given)."""
    path = argument(method, "local_path")
    if name == SAVE_CHECKPOINT:
        read = argument(method, "global_step")

        def step_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
            return step_or_none(read(args, kwargs))

    else:

        def step_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
            return checkpoint_step(path(args, kwargs))

    @functools.wraps(method)
    def saving_or_loading(*args: Any, **kwargs: Any) -> Any:
        if nested_in_itself(name):
            return method(*args, **kwargs)
        folder = path(args, kwargs)
        with stage(name, step=step_of(args, kwargs), path=None if folder is None else str(folder)):
            return method(*args, **kwargs)

    return saving_or_loading


def wake_up(resume: Callable[..., Any]) -> Callable[..., Any]:
    """The rollout adapter's ``resume(tags)`` as ``rollout_wake_up`` (``meta["tags"]``)."""
    tags = argument(resume, "tags")

    @functools.wraps(resume)
    async def waking(*args: Any, **kwargs: Any) -> Any:
        with stage(ROLLOUT_WAKE_UP, tags=tags(args, kwargs)):
            return await resume(*args, **kwargs)

    return waking


def sending(update_weights: Callable[..., Any]) -> Callable[..., Any]:
    """The rollout adapter's ``update_weights(weights, ..., global_steps=N, peft_config=...)``
    with its ``weights`` shown to the payload's watchers as they pass (:mod:`._weights`)."""
    signature = inspect.signature(update_weights)

    @functools.wraps(update_weights)
    async def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return await update_weights(*args, **kwargs)  # the call itself will raise
        var_keyword = _var_keyword(signature)
        extra = bound.arguments.get(var_keyword, {}) if var_keyword else {}
        step = bound.arguments.get("global_steps", extra.get("global_steps"))
        peft_config = bound.arguments.get("peft_config", extra.get("peft_config"))
        wire_format = bound.arguments.get("wire_format", extra.get("wire_format", "named_tensors"))
        if "weights" in bound.arguments and wire_format == "named_tensors":
            payload = Payload(step=step_or_none(step), adapter=peft_config is not None)
            bound.arguments["weights"] = passing(bound.arguments["weights"], payload)
        return await update_weights(*bound.args, **bound.kwargs)

    return watched


def engine_sending(send_weights: Callable[..., Any]) -> Callable[..., Any]:
    """A checkpoint engine's ``send_weights(weights, global_steps=N)`` with its ``weights``
    shown to the payload's watchers as they pass; sync or async, as the engine wrote it."""
    signature = inspect.signature(send_weights)
    parameters = list(signature.parameters)
    sent = parameters[1] if len(parameters) > 1 else None  # the first after self

    def shown(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return args, kwargs  # the call itself will raise
        if sent is None or sent not in bound.arguments:
            return args, kwargs
        step = step_or_none(bound.arguments.get("global_steps"))
        seen_at = f"{type(args[0]).__name__}.send_weights"
        payload = Payload(step=step, adapter=False, seen_at=seen_at, loaded_on_return=False)
        bound.arguments[sent] = passing(bound.arguments[sent], payload)
        return bound.args, bound.kwargs

    if inspect.iscoroutinefunction(send_weights):

        @functools.wraps(send_weights)
        async def watched_async(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = shown(args, kwargs)
            return await send_weights(*args, **kwargs)

        return watched_async

    @functools.wraps(send_weights)
    def watched(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = shown(args, kwargs)
        return send_weights(*args, **kwargs)

    return watched


def _var_keyword(signature: inspect.Signature) -> str | None:
    return next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
