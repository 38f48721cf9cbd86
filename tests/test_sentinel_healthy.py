"""Healthy training the sentinel's spike rule was never tuned on, with docs/sentinel.md's config
(examples/sentinel.yaml): no anomaly, nothing dumped, and every watched metric judged.

* the CPU demo, 25 steps: ``verl-events demo``'s training loop (:func:`run_rank`);
* a small random GPT-2 from transformers, 30 steps of a random but learnable language (a fixed
  random bigram chain, a fresh batch each step), AdamW and gradient clipping, its update emitted
  as verl's ``actor_update`` with ``@emits_stage``; and the same model with its loss scaled x10 at
  one step, which the rule catches there and nowhere else;
* verl 0.9.1's real trainer, 12 steps: ``test_verls_trainer_runs_healthy_steps_without_an_anomaly_or_a_passed_deadline``
  in tests/test_verl_trainer.py, with that module's job and doc helpers.

Each prints the margins its sentinel measured (docs/sentinel.md's table of them):
``./.venv/bin/python -m pytest tests/test_sentinel_healthy.py tests/test_verl_trainer.py -k healthy -s -q``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")  # the models train with torch; msprobe is armed
pytest.importorskip("msprobe")
transformers = pytest.importorskip("transformers")

import torch

import verl_events
from verl_events import emits_stage
from verl_events.apps.demo.options import DemoOptions
from verl_events.apps.demo.tiny import run_rank
from verl_events.observers.sentinel import ANOMALY_LOG, SpikeMargin

from .support import read_margins

pytestmark = pytest.mark.slow  # trains three models for a minute or two

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs/sentinel.md").read_text()
WATCHED = "actor/grad_norm"


def doc_config(save_path: Path) -> dict[str, Any]:
    """docs/sentinel.md's config (examples/sentinel.yaml, which it shows) writing under
    ``save_path``, plus an observer that leaves the sentinel's margins in ``save_path/margins``."""
    config = yaml.safe_load((REPO / "examples/sentinel.yaml").read_text())
    [shown] = [b for b in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.S) if b.startswith("# examples/sentinel.yaml")]
    assert yaml.safe_load(shown) == config, "docs/sentinel.md shows examples/sentinel.yaml as it is"
    assert [o["name"] for o in config["observers"]] == ["sentinel", "msprobe", "timing"]
    config["save_path"] = str(save_path)
    margins = {"_target_": "tests.support:SentinelMarginsFile", "folder": str(save_path / "margins")}
    config["observers"].append(margins)
    return config


def healthy_margins(save_path: Path, model: str, stages: list[str], judged: int) -> list[SpikeMargin]:
    """No anomaly and no dump under ``save_path``; the watched metric judged at least ``judged``
    times at each of ``stages`` and within its rule's limits there.  Prints the margins."""
    assert not (save_path / ANOMALY_LOG).exists(), (save_path / ANOMALY_LOG).read_text()
    assert list(save_path.rglob("dump.json")) == []
    margins = [m for m in read_margins(save_path / "margins") if m.metric == WATCHED]
    for margin in margins:
        print(f"{model}: {margin.describe()}")
    assert sorted(m.stage for m in margins) == sorted(stages)
    for margin in margins:
        assert margin.judged >= judged, margin
        assert margin.ratio is not None and margin.z is not None
        assert margin.ratio < margin.rule.ratio or margin.z <= margin.rule.z, margin
    return margins


def test_the_demo_trains_healthy_steps_without_an_anomaly(tmp_path: Path) -> None:
    run_rank(0, DemoOptions(doc_config(tmp_path), steps=25, nproc=1, seed=0))

    healthy_margins(tmp_path, "demo", ["actor_update"], judged=21)  # steps 5-25


# -- a small GPT-2 from transformers ------------------------------------------------

VOCAB, LENGTH, BATCH = 64, 32, 8


class LanguageModelWorker:
    """A 3-layer random GPT-2 learning a fixed random bigram chain; the attribute and stage
    names are verl's, so msprobe finds the model and the example rule its gradient norm."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0
        )
        self.actor_module = transformers.GPT2LMHeadModel(config)
        self.optimizer = torch.optim.AdamW(self.actor_module.parameters(), lr=1e-3)
        self.data = torch.Generator().manual_seed(1000 + seed)
        # Each token's successor is drawn from its own peaked distribution: learnable.
        self.chain = torch.softmax(3 * torch.randn(VOCAB, VOCAB, generator=self.data), dim=-1)

    def batch(self) -> torch.Tensor:
        tokens = torch.empty(BATCH, LENGTH, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=self.data)
        for i in range(1, LENGTH):
            tokens[:, i] = torch.multinomial(self.chain[tokens[:, i - 1]], 1, generator=self.data).squeeze(1)
        return tokens

    @emits_stage("actor_update")
    def update_actor(self, tokens: torch.Tensor, loss_scale: float = 1.0) -> dict[str, float]:
        loss = self.actor_module(tokens, labels=tokens).loss
        self.optimizer.zero_grad()
        (loss * loss_scale).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.actor_module.parameters(), max_norm=1.0)
        self.optimizer.step()
        return {"actor/loss": loss.item(), WATCHED: grad_norm.item()}


def train_gpt2(save_path: Path, steps: int, seed: int, scaled_step: int | None = None) -> list[float]:
    """Train under the doc's config; the losses, step by step."""
    worker = LanguageModelWorker(seed)
    losses = []
    with verl_events.install(doc_config(save_path)):
        for step in range(1, steps + 1):
            verl_events.set_step(step)
            metrics = worker.update_actor(worker.batch(), loss_scale=10.0 if step == scaled_step else 1.0)
            losses.append(metrics["actor/loss"])
    return losses


@pytest.mark.parametrize("seed", [0, 1])
def test_a_small_gpt2_trains_healthy_steps_without_an_anomaly(tmp_path: Path, seed: int) -> None:
    losses = train_gpt2(tmp_path, steps=30, seed=seed)

    assert sum(losses[-5:]) < sum(losses[:5])  # it learns
    healthy_margins(tmp_path, f"gpt2 seed {seed}", ["actor_update"], judged=26)  # steps 5-30


# msprobe hooks every submodule for backward, GPT-2's token embedding too, whose input (token ids)
# needs no gradient: torch warns about that hook in every backward of the dumped step.
@pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")
def test_a_gpt2_loss_scaled_x10_at_one_step_is_caught_there_only(tmp_path: Path) -> None:
    """The positive control: a loss summed where it should be averaged, once.  Clipping keeps
    the update itself in bounds, so training goes on healthy and only that step is a spike;
    msprobe, armed, dumps the next one."""
    train_gpt2(tmp_path, steps=20, seed=0, scaled_step=12)

    found = [json.loads(line) for line in (tmp_path / ANOMALY_LOG).read_text().splitlines()]
    assert [(a["step"], a["stage"], a["metric"], a["rule"]) for a in found] == [(12, "actor_update", WATCHED, "spike")]
    assert {p.relative_to(tmp_path).parts[:2] for p in tmp_path.rglob("dump.json")} == {("step_13", "actor_update")}
