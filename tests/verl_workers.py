"""verl-shaped workers built on verl 0.9.1's real profiler classes, as verl's own
workers are: ``DistProfilerExtension`` mixed in, stages decorated with
``@register(...)`` over ``@DistProfiler.annotate(role=...)``, models where verl's
engine workers keep them (``actor.engine.module``, ``ref.engine.module``,
``critic.engine.module``).  Used by the bridge tests, in process, in two
processes and as Ray actors (so this module must stay importable by path)."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections import Counter
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from verl import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.profiler import DistProfiler, DistProfilerExtension

with warnings.catch_warnings():  # verl's rollout package imports Ray's state API, which warns that it moved
    warnings.simplefilter("ignore", DeprecationWarning)
    from verl.workers.rollout.base import BaseRollout


def features(data: Any) -> torch.Tensor:
    """The batch's inputs, from a DataProto (verl's legacy workers) or a TensorDict (its engine workers)."""
    return data.batch["x"] if isinstance(data, DataProto) else data["x"]


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def engine(model: nn.Module) -> Any:
    return SimpleNamespace(engine=SimpleNamespace(module=model))


class Rollout(BaseRollout):  # type: ignore[misc]
    """A worker-side rollout adapter on verl's real ``BaseRollout``, as the engine workers
    hold one (``self.rollout``); it records what the sync hands it."""

    def __init__(self) -> None:  # verl's takes engine configs this adapter has no use for
        self.resumed: list[list[str]] = []
        self.synced: dict[str, torch.Tensor] = {}

    async def resume(self, tags: list[str]) -> None:
        self.resumed.append(list(tags))

    async def release(self) -> None:
        pass

    async def update_weights(self, weights: Any, **kwargs: Any) -> None:
        self.synced = {name: tensor.detach().clone() for name, tensor in weights}


class TrainingWorker(DistProfilerExtension):  # type: ignore[misc]
    """verl 0.9.1's inner worker (``engine_workers.TrainingWorker``): it saves and loads the model."""

    def __init__(self, model: nn.Module, rank: int = 0) -> None:
        self.model = model
        DistProfilerExtension.__init__(self, DistProfiler(rank=rank, config=None))

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        os.makedirs(local_path, exist_ok=True)
        torch.save(self.model.state_dict(), os.path.join(local_path, "model.pt"))

    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        self.model.load_state_dict(torch.load(os.path.join(local_path, "model.pt")))


class ActorRolloutRefWorker(DistProfilerExtension):  # type: ignore[misc]
    def __init__(self, rank: int = 0, profiler: Any = None) -> None:
        self.rank = rank
        self.rollout = Rollout()
        self.actor = engine(tiny_model(0))
        self.trainer = TrainingWorker(self.actor.engine.module, rank)
        self.ref = engine(tiny_model(0))
        self.optimizer = torch.optim.SGD(self.actor.engine.module.parameters(), lr=0.1)
        self.calls: Counter[str] = Counter()
        DistProfilerExtension.__init__(self, profiler if profiler is not None else DistProfiler(rank=rank, config=None))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @DistProfiler.annotate(color="red", role="rollout_generate")
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls["generate_sequences"] += 1
        with torch.no_grad():
            out = self.actor.engine.module(prompts.batch["x"])
        return DataProto.from_dict(tensors={"x": out.detach()}, meta_info=dict(prompts.meta_info))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @DistProfiler.annotate(color="olive", role="ref_compute_log_prob")
    def compute_ref_log_prob(self, data: DataProto) -> float:
        self.calls["compute_ref_log_prob"] += 1
        with torch.no_grad():
            return float(torch.log_softmax(self.ref.engine.module(features(data)), -1).mean())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @DistProfiler.annotate(color="blue", role="actor_compute_log_prob")
    def compute_log_prob(self, data: DataProto) -> float:
        self.calls["compute_log_prob"] += 1
        with torch.no_grad():
            return float(torch.log_softmax(self.actor.engine.module(features(data)), -1).mean())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @DistProfiler.annotate(color="red", role="actor_update")
    def update_actor(self, data: DataProto) -> float:
        self.calls["update_actor"] += 1
        loss = self.actor.engine.module(features(data)).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> None:
        """verl 0.9.1's signature and order (``engine_workers.py``): the trainer calls it after
        each step's actor update; the rollout wakes its weights, takes them, wakes its KV cache."""
        self.calls["update_weights"] += 1
        await self.rollout.resume(tags=["weights"])
        await self.rollout.update_weights(self.actor.engine.module.state_dict().items(), global_steps=global_steps)
        if torch.distributed.is_initialized():  # every rank has sent before the cache wakes
            await asyncio.to_thread(torch.distributed.barrier)
        await self.rollout.resume(tags=["kv_cache"])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """verl 0.9.1's signature; like verl's, it calls the inner training worker's."""
        self.calls["save_checkpoint"] += 1
        self.trainer.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        """verl 0.9.1's signature: no step, only the path (``.../global_step_N/actor``)."""
        self.calls["load_checkpoint"] += 1
        self.trainer.load_checkpoint(local_path, hdfs_path, del_local_after_load)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def call_counts(self) -> dict[str, int]:
        return dict(self.calls)


class CriticWorker(DistProfilerExtension):  # type: ignore[misc]
    def __init__(self, rank: int = 0) -> None:
        self.critic = engine(tiny_model(1))
        self.calls: Counter[str] = Counter()
        DistProfilerExtension.__init__(self, DistProfiler(rank=rank, config=None))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @DistProfiler.annotate(color="cyan", role="compute_values")
    def compute_values(self, data: DataProto) -> float:
        self.calls["compute_values"] += 1
        with torch.no_grad():
            return float(self.critic.engine.module(data.batch["x"]).mean())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @DistProfiler.annotate(color="pink", role="critic_update")
    def update_critic(self, data: DataProto) -> float:
        self.calls["update_critic"] += 1
        loss = self.critic.engine.module(data.batch["x"]).pow(2).mean()
        loss.backward()
        return float(loss.detach())


def batch(step: int | None = None, seed: int = 0) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    meta = {} if step is None else {"global_steps": step}
    return DataProto.from_dict(tensors={"x": torch.randn(4, 8, generator=generator)}, meta_info=meta)


def train_step(actor: ActorRolloutRefWorker, critic: CriticWorker | None, step: int, profiled: bool) -> None:
    """What verl's PPO trainer does each step: start_profile(profile_step=N) only on
    profiled steps, the stages in verl's order, stop_profile.  Only the generation
    batch carries meta_info["global_steps"], as in verl."""
    if profiled:
        actor.start_profile(role="train", profile_step=step)
        if critic is not None:
            critic.start_profile(profile_step=step)
    generated = actor.generate_sequences(batch(step))
    data = batch(seed=step)
    actor.compute_ref_log_prob(data)
    actor.compute_log_prob(data)
    if critic is not None:
        critic.compute_values(data)
        critic.update_critic(data)
    actor.update_actor(data)
    assert generated.meta_info["global_steps"] == step
    if profiled:
        actor.stop_profile()
        if critic is not None:
            critic.stop_profile()
