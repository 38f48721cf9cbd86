"""``verl-events demo``: a miniature PPO loop on CPU, observed end to end.

Small torch models built in code (no downloads): the actor is a tiny causal
transformer, the reference policy a frozen copy, the critic a transformer
with a value head.  Each step calls verl's stages in verl's order through
``@emits_stage`` worker methods, with a DataProto-like batch carrying
``meta_info["global_steps"]``.  With ``--nproc N`` the loop runs in N
processes joined by torch.distributed (gloo) that all-reduce gradients.

Imported only by the CLI: the core package never imports torch.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import verl_events
from verl_events import STAGE_ROLES, emits_stage
from verl_events.apps.overhead import TimingLogError, overhead_table, read_timing_records

STAGE_ORDER = tuple(STAGE_ROLES)  # the order verl runs its stages in

#: The stages the demo runs each step, in verl's order.
DEMO_STAGES = tuple(s for s in STAGE_ORDER if s not in ("compute_rm_score", "train_batch", "forward_backward"))
VOCAB, DIM, HEADS, LAYERS = 128, 64, 4, 2
PROMPT_LEN, RESPONSE_LEN, BATCH = 8, 16, 16
TARGET_TOKEN = 7  # the toy reward: how often the response says 7
GRAD_CLIP = 1.0  # verl's actor default
INJECTED_WEIGHT = "blocks.1.mlp.0.weight"  # what --perturb and --inject change
SPIKE_SCALE = 50.0


def default_config(save_path: str) -> dict[str, Any]:
    """msprobe statistics at L1 on steps 1-2 for the actor and ref stages;
    timing on every stage of every step."""
    return {
        "save_path": save_path,
        "observers": [
            {"name": "timing"},
            {
                "name": "msprobe",
                "steps": ["1-2"],
                "stages": ["actor_compute_log_prob", "ref_compute_log_prob", "actor_update"],
            },
        ],
    }


# -- models ------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, length, _ = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(batch, length, 3, HEADS, DIM // HEADS).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        h = h + self.proj(attn.transpose(1, 2).reshape(batch, length, DIM))
        return h + self.mlp(self.norm2(h))


class TinyCausalLM(nn.Module):
    def __init__(self, out_dim: int = VOCAB) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(PROMPT_LEN + RESPONSE_LEN, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, out_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


# -- verl-shaped workers -----------------------------------------------------


@dataclass
class Batch:
    """The part of verl's DataProto the demo needs."""

    tensors: dict[str, torch.Tensor]
    meta_info: dict[str, Any] = field(default_factory=dict)


def sampling_probs(logits: torch.Tensor) -> torch.Tensor:
    """Next-token probabilities.  A broken model (NaN logits) still samples,
    uniformly, as a rollout engine keeps generating: the run goes on, so
    that the steps after an anomaly can be captured."""
    probs = torch.nan_to_num(torch.softmax(logits, -1), nan=0.0)
    dead = probs.sum(-1, keepdim=True) <= 0
    return torch.where(dead, torch.full_like(probs, 1.0 / probs.shape[-1]), probs)


def response_log_probs(model: nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    logits = model(sequences[:, :-1])[:, PROMPT_LEN - 1 :]
    return torch.log_softmax(logits, dim=-1).gather(-1, sequences[:, PROMPT_LEN:, None]).squeeze(-1)


def average_gradients(model: nn.Module) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)
                param.grad /= dist.get_world_size()


class ActorRolloutRefWorker:
    """Attribute names follow verl's, so the model resolver finds them."""

    def __init__(self, actor: nn.Module, ref: nn.Module) -> None:
        self.actor_module = actor
        self.ref_module = ref
        self.optimizer = torch.optim.AdamW(actor.parameters(), lr=3e-4)

    @emits_stage("rollout_generate")
    def generate_sequences(self, prompts: Batch) -> Batch:
        sequences = prompts.tensors["prompts"]
        with torch.no_grad():
            for _ in range(RESPONSE_LEN):
                logits = self.actor_module(sequences)[:, -1]
                next_token = torch.multinomial(sampling_probs(logits), 1)
                sequences = torch.cat([sequences, next_token], dim=1)
        return Batch({"sequences": sequences}, dict(prompts.meta_info))

    @emits_stage("ref_compute_log_prob")
    def compute_ref_log_prob(self, data: Batch) -> Batch:
        with torch.no_grad():
            data.tensors["ref_log_prob"] = response_log_probs(self.ref_module, data.tensors["sequences"])
        return data

    @emits_stage("actor_compute_log_prob")
    def compute_log_prob(self, data: Batch) -> Batch:
        with torch.no_grad():
            data.tensors["old_log_prob"] = response_log_probs(self.actor_module, data.tensors["sequences"])
        return data

    @emits_stage("actor_update")
    def update_actor(self, data: Batch) -> dict[str, float]:
        """One PPO update; returns metrics named as verl's actor names them."""
        t = data.tensors
        log_prob = response_log_probs(self.actor_module, t["sequences"])
        ratio = torch.exp(log_prob - t["old_log_prob"])
        clipped = torch.clamp(ratio, 0.8, 1.2)
        policy_loss = -torch.min(ratio * t["advantages"], clipped * t["advantages"]).mean()
        kl = (log_prob - t["ref_log_prob"]).mean()
        loss = policy_loss + 0.01 * kl
        self.optimizer.zero_grad()
        loss.backward()
        average_gradients(self.actor_module)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.actor_module.parameters(), max_norm=GRAD_CLIP)
        if torch.isfinite(grad_norm):
            self.optimizer.step()  # like verl, skip the update when the gradient is not finite
        return {"actor/pg_loss": policy_loss.item(), "actor/kl": kl.item(), "actor/grad_norm": grad_norm.item()}


class CriticWorker:
    def __init__(self, critic: nn.Module) -> None:
        self.critic_module = critic
        self.optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-3)

    def _values(self, sequences: torch.Tensor) -> torch.Tensor:
        return self.critic_module(sequences[:, :-1])[:, PROMPT_LEN - 1 :, 0]

    @emits_stage("compute_values")
    def compute_values(self, data: Batch) -> Batch:
        with torch.no_grad():
            data.tensors["values"] = self._values(data.tensors["sequences"])
        return data

    @emits_stage("critic_update")
    def update_critic(self, data: Batch) -> float:
        loss = F.mse_loss(self._values(data.tensors["sequences"]), data.tensors["returns"])
        self.optimizer.zero_grad()
        loss.backward()
        average_gradients(self.critic_module)
        self.optimizer.step()
        return loss.item()


def compute_advantages(data: Batch, gamma: float = 1.0, lam: float = 0.95) -> None:
    """GAE with a terminal reward, on the trainer side (not a stage in verl either)."""
    t = data.tensors
    rewards = torch.zeros_like(t["values"])
    rewards[:, -1] = (t["sequences"][:, PROMPT_LEN:] == TARGET_TOKEN).float().mean(-1)
    rewards[:, -1] -= 0.1 * (t["old_log_prob"] - t["ref_log_prob"]).sum(-1)  # KL penalty, as PPO does
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0])
    for i in reversed(range(rewards.shape[1])):
        next_value = t["values"][:, i + 1] if i + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, i] + gamma * next_value - t["values"][:, i]
        running = delta + gamma * lam * running
        advantages[:, i] = running
    t["returns"] = advantages + t["values"]
    t["advantages"] = (advantages - advantages.mean()) / (advantages.std() + 1e-6)


# -- the run -----------------------------------------------------------------


@dataclass(frozen=True)
class Injection:
    """``--inject KIND@STEP``: corrupt ``INJECTED_WEIGHT`` of the actor on the last rank
    at the begin of ``step``'s actor update (nan: one element; spike: times
    ``SPIKE_SCALE``), through the :class:`~verl_events.apps.inject.WeightFault` observer."""

    kind: str
    step: int

    KINDS = ("nan", "spike")

    @classmethod
    def parse(cls, text: str, steps: int) -> Injection:
        kind, _, step = text.partition("@")
        if kind not in cls.KINDS or not step.isdigit() or not 1 <= int(step) <= steps:
            raise ValueError(
                f"--inject: {text!r} is not allowed; use nan@STEP or spike@STEP with STEP from 1 to {steps} (--steps)"
            )
        return cls(kind, int(step))

    def observer_entry(self, nproc: int) -> dict[str, Any]:
        # The last rank only: the others see the fault through the averaged gradients.
        return {
            "_target_": "verl_events.apps.inject:WeightFault",
            "kind": self.kind,
            "step": self.step,
            "parameter": INJECTED_WEIGHT,
            "scale": SPIKE_SCALE,
            "stages": ["actor_update"],
            "ranks": [nproc - 1],
        }


@dataclass(frozen=True)
class DemoOptions:
    config: dict[str, Any]
    steps: int
    nproc: int
    seed: int
    perturb: float = 0.0
    port: int = 0
    inject: Injection | None = None


def run_rank(rank: int, options: DemoOptions, progress: Callable[[int, str], None] | None = None) -> None:
    """One process of the demo: build the models, install the observers, train."""
    if options.nproc > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(options.port))
        dist.init_process_group("gloo", rank=rank, world_size=options.nproc)
        torch.set_num_threads(1)
    torch.manual_seed(options.seed)  # same initial weights on every rank
    actor = TinyCausalLM()
    ref = copy.deepcopy(actor).requires_grad_(False)
    if options.perturb:
        # One actor weight off by a relative `perturb`, to try `verl-events compare`:
        # the first divergence is the first op that reads it.
        with torch.no_grad():
            actor.get_parameter(INJECTED_WEIGHT).mul_(1 + options.perturb)
    critic = TinyCausalLM(out_dim=1)
    actor_worker, critic_worker = ActorRolloutRefWorker(actor, ref), CriticWorker(critic)
    data_rng = torch.Generator().manual_seed(options.seed * 1000 + rank)
    try:
        config = options.config
        if options.inject is not None:
            config = {
                **config,
                "observers": [*config.get("observers", []), options.inject.observer_entry(options.nproc)],
            }
        with verl_events.install(config):
            for step in range(1, options.steps + 1):
                prompts = torch.randint(0, VOCAB, (BATCH, PROMPT_LEN), generator=data_rng)
                torch.manual_seed(options.seed * 100_000 + rank * 1000 + step)  # sampling
                batch = Batch({"prompts": prompts}, {"global_steps": step})
                stages: list[tuple[str, Callable[[Batch], Any]]] = [
                    ("rollout_generate", actor_worker.generate_sequences),
                    ("ref_compute_log_prob", actor_worker.compute_ref_log_prob),
                    ("actor_compute_log_prob", actor_worker.compute_log_prob),
                    ("compute_values", critic_worker.compute_values),
                    ("critic_update", critic_worker.update_critic),
                    ("actor_update", actor_worker.update_actor),
                ]
                for name, call in stages:
                    if progress is not None:
                        progress(step, name)
                    result = call(batch)
                    if isinstance(result, Batch):
                        batch = result
                    if name == "compute_values":
                        compute_advantages(batch)
    finally:
        if dist.is_initialized():
            # Tear gloo down only once every rank is done with it: a rank that
            # exits while its peer is still tearing down can abort the peer.
            dist.barrier()
            dist.destroy_process_group()


def _spawned(rank: int, options: DemoOptions) -> None:
    def progress(step: int, stage: str) -> None:  # rank 0 speaks for all; a bar cannot span processes
        if stage == DEMO_STAGES[0]:
            print(f"demo: step {step}/{options.steps} on {options.nproc} ranks", file=sys.stderr, flush=True)

    run_rank(rank, options, progress if rank == 0 else None)
    # Everything is written and closed by now.  Leave without the interpreter's
    # teardown: gloo's C++ threads have been seen to abort a finished rank
    # while static objects are destroyed ("terminate called without an active
    # exception"), which would fail a run whose work is done.
    import multiprocessing.util

    multiprocessing.util._exit_function()  # type: ignore[attr-defined]  # what a normal exit runs: release queues and semaphores
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DemoRankError(RuntimeError):
    """A spawned demo rank raised; the message is its error's last line."""


def run_demo(options: DemoOptions) -> Path:
    """Run all ranks, show progress, print the overhead table; return save_path."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from verl_events.layout import run_id

    from .report import terminal_console

    console = terminal_console(stderr=True)
    save_path = Path(options.config.get("save_path", "outputs/profile"))
    started = time.perf_counter()
    if options.nproc > 1:
        import torch.multiprocessing as mp

        console.print(f"demo: {options.steps} steps on {options.nproc} processes (gloo) ...")
        run_id()  # made up here and inherited, so that the ranks agree on their run
        with_port = dataclasses.replace(options, port=_free_port())
        try:
            mp.spawn(_spawned, args=(with_port,), nprocs=options.nproc)  # type: ignore[attr-defined]
        except mp.ProcessRaisedException as exc:  # type: ignore[attr-defined]
            # Its message is the rank's whole traceback; its last line says what happened.
            raise DemoRankError(f"a demo rank failed: {str(exc).strip().splitlines()[-1]}") from exc
    else:
        columns = (
            TextColumn("[bold]step {task.fields[step]}[/] {task.fields[stage]:<24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("demo", total=options.steps * len(DEMO_STAGES), step=1, stage="")

            def progress(step: int, stage: str) -> None:
                bar.update(task, advance=0 if (step, stage) == (1, DEMO_STAGES[0]) else 1, step=step, stage=stage)

            run_rank(0, options, progress)
            bar.update(task, completed=options.steps * len(DEMO_STAGES), stage="done")
    print_summary(save_path, time.perf_counter() - started, console)
    return save_path


def preflight(config: dict[str, Any]) -> None:
    """Build the observers once here and close them, so that a config that would
    fail (msprobe missing, a save path holding another run's files) stops the demo
    before its worker processes start, where it would end in a traceback.
    Raises :class:`ConfigError` or :class:`ObserverSetupError`."""
    with verl_events.install(config):
        pass


def print_summary(save_path: Path, seconds: float, console: Any) -> None:
    from .report import render_overhead

    skipped: list[str] = []
    try:
        rows = overhead_table(read_timing_records(save_path, skipped=skipped), STAGE_ORDER)
    except TimingLogError as exc:
        console.print(f"[red]the overhead table cannot be shown:[/] {exc}")
        rows = []
    for note in skipped:
        console.print(f"[yellow]warning:[/] {note}")
    render_overhead(rows, console, title=f"Stage overhead, from {save_path}/timing (medians over all ranks)")
    dumps = sorted(save_path.glob("step_*/*/step*/rank*/dump.json"))
    console.print(f"{len(dumps)} msprobe dump.json files under {save_path}, e.g. {dumps[0] if dumps else '(none)'}")
    console.print(f"demo finished in {seconds:.1f} s; see it again with: verl-events report {save_path}")
