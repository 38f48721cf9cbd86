"""Real models and real msprobe dumps for the mismatch tests (tests/test_mismatch.py,
tests/test_mismatch_plot.py): a small decoder-shaped model dumped on both sides of a
trainer/engine comparison, and a log-prob gap between two sides."""

from __future__ import annotations

from pathlib import Path

import torch

import verl_events
from verl_events import stage


def random_gap(seed: int = 0, shape: tuple[int, int] = (3, 4)) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(shape, generator=generator) * 6
    return rollout + torch.randn(shape, generator=generator) * 0.05, rollout


class Embed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(32, 16))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids]


class Norm(torch.nn.Module):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6)


class Body(torch.nn.Module):
    """An embedding, two residual blocks (linear, activation), a norm: layers as in a decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = Embed()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(2)
        )
        self.norm = Norm()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for layer in self.layers:
            hidden = hidden + layer(hidden)
        return self.norm(hidden)


class Tiny(torch.nn.Module):
    """The body under ``model`` and a head, as in a causal LM: with verl imported, msprobe's
    L0 leaves the first and the last of ``named_modules()`` out of the dump (Qwen2's ``model``
    and ``lm_head``), so these two take those places and the layers under test are dumped."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Body()
        self.head = torch.nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.model(ids))


def dump_both_sides(
    save_path: Path, engine: Tiny, trainer: Tiny, engine_calls: int = 2, config: str = "tensor_L0"
) -> None:
    sequences = [torch.tensor([[1, 5, 7, 9]]), torch.tensor([[2, 3, 4]])]
    msprobe = {"name": "msprobe", "config_path": config, "stages": ["actor_compute_log_prob", "rollout_prefill"]}
    with verl_events.install({"save_path": str(save_path), "observers": [msprobe]}), torch.no_grad():
        with stage("actor_compute_log_prob", step=1, model=trainer):
            for ids in sequences:
                trainer(ids)
        with stage("rollout_prefill", step=1, model=engine, rank=0):
            for ids in sequences[:engine_calls]:
                engine(ids)
