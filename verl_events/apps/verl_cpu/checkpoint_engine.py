"""A CPU checkpoint engine, so that verl 0.9.1's ``separate_async`` trainer runs on CPU.

``separate_async`` refuses verl's in-process ``naive`` weight sync (``trainer_separate_async.py:68``)
and every other engine verl ships needs a transport this machine lacks (cupy, NIXL, Mooncake,
torch_npu). This one hands the trainer's named tensors to the rollout workers through a named Ray
actor, the *mailbox*; :data:`SEPARATE_ASYNC` holds the overrides that load it into the CPU job.

verl's ``CheckpointEngineManager`` drives each sync (``checkpoint_engine/base.py``): ``prepare``;
``build_topology`` in the driver finds the mailbox and names the sync with a fresh token (not
``global_steps``: separate_async syncs twice at step 0); ``init_process_group`` on every worker;
rank 0 sends while each rollout worker reads; ``finalize`` empties the mailbox."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, cast

import ray
import torch
from ray.actor import ActorHandle
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

__all__ = ["BACKEND", "SEPARATE_ASYNC", "CpuRayCheckpointEngine"]

#: The engine's name in verl's registry (``...checkpoint_engine.backend``).
BACKEND = "cpu_ray"

_ENGINE = "actor_rollout_ref.rollout.checkpoint_engine"

#: Hydra overrides that switch the CPU job (:func:`~.job.trainer_args`) to ``separate_async``.
SEPARATE_ASYNC: list[str] = [
    "trainer.v1.trainer_mode=separate_async",
    # separate_async asserts train_batch_size == parameter_sync_step * ppo_mini_batch_size (4 == 2 * 2).
    "trainer.v1.separate_async.parameter_sync_step=2",
    # The standalone rollout (asserted > 0): one replica on one fake GPU beside the trainer's.
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "+ray_kwargs.ray_init.num_gpus=2",
    # The second rollout replica brings its own workers, each asking Ray for a CPU.
    "ray_kwargs.ray_init.num_cpus=12",
    f"{_ENGINE}.custom_backend_module=verl_events.apps.verl_cpu.checkpoint_engine",
    f"{_ENGINE}.backend={BACKEND}",
]

_MAILBOX_NAME = f"verl_events_{BACKEND}_mailbox"

Named = tuple[str, torch.Tensor]
Bucket = list[Named]


class _Mailbox:
    """Each sync's buckets, by token, kept until the sender drops them: every rollout worker reads
    them all, at its own pace. An async actor: its methods share one event loop, so never race."""

    def __init__(self) -> None:
        self._syncs: dict[str, list[tuple[Bucket, bool]]] = {}
        self._arrived = asyncio.Condition()

    async def put(self, token: str, bucket: Bucket, last: bool) -> None:
        async with self._arrived:
            self._syncs.setdefault(token, []).append((bucket, last))
            self._arrived.notify_all()

    async def get(self, token: str, index: int, timeout_s: float) -> tuple[Bucket, bool]:
        """Bucket ``index`` of sync ``token`` and whether it is the last, waiting for it to arrive."""
        async with self._arrived:
            try:
                arrived = self._arrived.wait_for(lambda: len(self._syncs.get(token, ())) > index)
                await asyncio.wait_for(arrived, timeout_s)
            except asyncio.TimeoutError:
                raise TimeoutError(
                    f"{BACKEND}: bucket {index} of weight sync {token} did not come within {timeout_s:g} s from "
                    f"the trainer's rank 0 (see its log); wait longer with {_ENGINE}.engine_kwargs.{BACKEND}.timeout_s"
                ) from None
            return self._syncs[token][index]

    async def drop(self, token: str) -> None:
        self._syncs.pop(token, None)


_RemoteMailbox = ray.remote(num_cpus=0)(_Mailbox)  # num_cpus=0: no CPU taken from verl's placement groups
# Ray ends the mailbox once its creator's handles are gone (later ones from get_if_exists do not
# count): the driver keeps the first, per Ray session and job, for the whole run.  Module state,
# not an engine's: verl's CheckpointEngineManager calls the classmethod build_topology in the
# driver, where no engine instance exists, and the handle must outlive each call.
_mailbox: tuple[str, ActorHandle[_Mailbox]] | None = None


def _open_mailbox() -> ActorHandle[_Mailbox]:
    global _mailbox
    context = ray.get_runtime_context()
    session = f"{context.get_session_name()}/{context.get_job_id()}"
    if _mailbox is None or _mailbox[0] != session:
        handle = _RemoteMailbox.options(name=_MAILBOX_NAME, get_if_exists=True).remote()
        _mailbox = (session, cast("ActorHandle[_Mailbox]", handle))
    return _mailbox[1]


def _read(mailbox: ActorHandle[_Mailbox], token: str, timeout_s: float) -> Iterator[Named]:
    """One sync's weights, fetched bucket by bucket as the adapter iterates.

    A plain generator, as the naive engine yields: this project's ``hf`` adapter reads with ``for``,
    verl's vLLM and SGLang adapters take either kind, and the weight_sync observer's payload tap
    hands an adapter an async iterator whenever it is given one. Each fetch holds the worker's event
    loop (harmless: it has nothing else to do during a sync; Ray warns once per process).
    """
    index, last = 0, False
    while not last:
        bucket, last = ray.get(mailbox.get.remote(token, index, timeout_s))
        yield from bucket
        index += 1


@CheckpointEngineRegistry.register(BACKEND)
class CpuRayCheckpointEngine(CheckpointEngine):
    """Named tensors from the trainer's rank 0 to every rollout worker, through the mailbox.

    ``bucket_size`` (bytes) bounds each Ray message; the mailbox holds a whole sync until
    ``finalize``. ``timeout_s`` (``engine_kwargs.cpu_ray.timeout_s``) bounds a reader's wait for
    each bucket: a sender that died raises :class:`TimeoutError` there, not a hang. Tensors keep
    the trainer's dtype; the adapter casts, as after verl's ``naive`` sync.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0) -> None:
        if bucket_size <= 0 or timeout_s <= 0:
            raise ValueError(f"{BACKEND}: bucket_size and timeout_s must be > 0, not {bucket_size} and {timeout_s}")
        self.bucket_size, self.is_master, self.timeout_s = bucket_size, is_master, timeout_s
        self._mailbox: ActorHandle[_Mailbox] | None = None
        self._token: str | None = None  # set between init_process_group and finalize
        self._sends = False

    def prepare(self) -> dict[str, Any]:
        return {"is_master": self.is_master}  # nothing to allocate: the mailbox grows as buckets come

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict[str, Any]]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        masters = [rank for rank, meta in enumerate(metadata[:actor_wg_world_size]) if meta.get("is_master")]
        if len(masters) != 1:
            raise ValueError(f"{BACKEND}: exactly one trainer rank must be is_master to send, got ranks {masters}")
        mailbox, token = _open_mailbox(), uuid.uuid4().hex

        def joining(sends: list[bool]) -> dict[str, list[Any]]:
            return {"mailbox": [mailbox] * len(sends), "token": [token] * len(sends), "sends": sends}

        senders = [rank == masters[0] for rank in range(actor_wg_world_size)]
        return joining(senders), joining([False] * rollout_world_size)

    def init_process_group(self, **topology: Any) -> None:
        """Join the sync ``build_topology`` named: ``mailbox``, ``token`` and whether this worker ``sends``."""
        self._mailbox, self._token, self._sends = topology["mailbox"], topology["token"], topology["sends"]

    def finalize(self) -> None:
        if self._sends and self._mailbox is not None and self._token is not None:
            # Not waited on: every worker has read the sync by now, and the next has a new token.
            self._mailbox.drop.remote(self._token)
        self._token = None

    def _joined(self, method: str) -> tuple[ActorHandle[_Mailbox], str]:
        if self._mailbox is None or self._token is None:
            message = "verl's CheckpointEngineManager opens one with build_topology and init_process_group"
            raise RuntimeError(f"{BACKEND}: {method} called outside a sync; {message}")
        return self._mailbox, self._token

    async def send_weights(self, weights: Iterable[Named], global_steps: int | None = None) -> dict[str, float]:
        """Put ``weights`` into the mailbox in buckets; returns the sync's metrics for the trainer."""
        mailbox, token = self._joined("send_weights")
        named = ensure_async_iterator(weights)  # type: ignore[no-untyped-call]
        if not self._sends:
            # Other trainer ranks still walk it: each FSDP full_tensor is a collective of all ranks.
            async for _ in named:
                pass
            return {}
        bucket, size, total, buckets = [], 0, 0, 0
        async for name, tensor in named:  # no copy: Ray serialises the tensors as put is called
            bucket.append((name, tensor.detach().cpu()))
            size += tensor.nbytes
            if size >= self.bucket_size:
                await mailbox.put.remote(token, bucket, False)
                bucket, total, size, buckets = [], total + size, 0, buckets + 1
        await mailbox.put.remote(token, bucket, True)  # the last, even empty, tells readers to stop
        return {"checkpoint_engine/payload_mbytes": (total + size) / 2**20, "checkpoint_engine/buckets": buckets + 1.0}

    # Not async, though the base declares it so: verl's CheckpointEngineWorker calls it without await
    # and hands the result to the adapter to iterate (base.py:354), as naive's plain generator shows.
    def receive_weights(self, global_steps: int | None = None) -> Iterator[Named]:  # type: ignore[override]
        """This sync's named tensors, in the sender's order, fetched as they are iterated."""
        mailbox, token = self._joined("receive_weights")
        return _read(mailbox, token, self.timeout_s)
