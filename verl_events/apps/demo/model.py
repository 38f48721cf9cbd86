"""The tiny engine's models and verl-shaped workers (torch, built in code: no downloads).

The actor is a tiny causal transformer, the reference policy a frozen copy,
the critic a transformer with a value head.  The workers' methods are verl's
stages, emitted with ``@emits_stage``, on a DataProto-like :class:`Batch`
carrying ``meta_info["global_steps"]``; gradients are all-reduced when
torch.distributed is initialised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from verl_events import emits_stage

VOCAB, DIM, HEADS, LAYERS = 128, 64, 4, 2
PROMPT_LEN, RESPONSE_LEN, BATCH = 8, 16, 16
TARGET_TOKEN = 7  # the toy reward: how often the response says 7
GRAD_CLIP = 1.0  # verl's actor default


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
        # Embedding tables of this module's own, looked up in its forward, not nn.Embedding
        # submodules: msprobe's L0 and mix dumps put a full backward hook on every submodule
        # (not on the model), and torch warns "Full backward hook is firing ..." in every
        # backward for one whose only input, token ids, needs no gradient.  The first hooked
        # module is then blocks.0, fed activations that do.  Initialised as nn.Embedding is,
        # in the same order: a seed gives the weights it gave before.
        self.embed = nn.Parameter(nn.init.normal_(torch.empty(VOCAB, DIM)))
        self.pos = nn.Parameter(nn.init.normal_(torch.empty(PROMPT_LEN + RESPONSE_LEN, DIM)))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, out_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = F.embedding(tokens, self.embed) + F.embedding(torch.arange(tokens.shape[1]), self.pos)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


# -- verl-shaped workers -----------------------------------------------------


@dataclass
class Batch:
    """The part of verl's DataProto the demo needs."""

    tensors: dict[str, torch.Tensor]
    meta_info: dict[str, Any] = field(default_factory=dict)

    def with_tensor(self, name: str, tensor: torch.Tensor) -> Batch:
        """A new batch: this one's tensors and ``name``, as verl's ``DataProto.union`` makes."""
        return Batch({**self.tensors, name: tensor}, dict(self.meta_info))


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

    # The forward-only stages return a new batch and leave theirs as it was, as verl's
    # workers do: a replay (after an anomaly) runs them again on the same batch.
    @emits_stage("ref_compute_log_prob")
    def compute_ref_log_prob(self, data: Batch) -> Batch:
        with torch.no_grad():
            return data.with_tensor("ref_log_prob", response_log_probs(self.ref_module, data.tensors["sequences"]))

    @emits_stage("actor_compute_log_prob")
    def compute_log_prob(self, data: Batch) -> Batch:
        with torch.no_grad():
            return data.with_tensor("old_log_prob", response_log_probs(self.actor_module, data.tensors["sequences"]))

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
            return data.with_tensor("values", self._values(data.tensors["sequences"]))

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
