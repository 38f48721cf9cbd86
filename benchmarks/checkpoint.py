"""What the checkpoint observer costs a save and a load, next to the save itself.

    python benchmarks/checkpoint.py [--repeats 3] [--params 64]

Builds a model of ``--params`` million float32 parameters (square Linear layers), takes one
AdamW step (so the optimizer holds two moments per parameter), then, in a temporary folder,
saves and loads it part by part as verl's FSDP checkpoint manager does, inside real
``save_checkpoint`` / ``load_checkpoint`` stages:

1. a save with nothing watching, and with the ``checkpoint`` observer installed: seconds,
   the observer's share, and its seconds per GB of state described; and the ledger's own
   ``seconds`` (the time spent describing tensors, measured inside the taps);
2. the same for a load (the observer describes what ``torch.load`` returned and what the
   model and optimizer hold after ``load_state_dict``: twice the state);
3. ``torch.save`` of a small object outside any stage, with the taps on and off: what
   every other ``torch.save`` of the process pays;
4. the estimate for a 7B model's shards (7.6 G parameters: float32 weights and two float32
   Adam moments, 91 GB in all) over 8 ranks, from the throughput in 1 and 2.

Prints the median of ``--repeats`` after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import verl_events
from verl_events import stage
from verl_events.observers.checkpoint.record import CheckpointRecord, checkpoint_log_path

SEVEN_B = 7.6e9
#: float32 weights, and AdamW's exp_avg and exp_avg_sq: 12 bytes a parameter.
BYTES_PER_PARAMETER = 12


def build(million: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    width = 1024
    layers = max(1, million * 1_000_000 // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    return model, optimizer


def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path, step: int) -> None:
    with stage("save_checkpoint", step=step, path=str(folder)):
        torch.save(model.state_dict(), folder / "model_world_size_1_rank_0.pt")
        torch.save(optimizer.state_dict(), folder / "optim_world_size_1_rank_0.pt")


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path, step: int) -> None:
    with stage("load_checkpoint", step=step, path=str(folder)):
        model.load_state_dict(torch.load(folder / "model_world_size_1_rank_0.pt"))
        optimizer.load_state_dict(torch.load(folder / "optim_world_size_1_rank_0.pt"))


def median_s(action: Callable[[], None], repeats: int) -> float:
    action()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def described_s(save_path: Path) -> dict[str, float]:
    """The median of the ledger's ``seconds`` (the time spent describing tensors) by kind."""
    lines = checkpoint_log_path(save_path).read_text().splitlines()
    records = [CheckpointRecord.from_json(line) for line in lines]
    return {kind: statistics.median(r.seconds for r in records if r.kind == kind) for kind in ("saved", "loaded")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--params", type=int, default=64, help="million float32 parameters")
    args = parser.parse_args()
    model, optimizer = build(args.params)
    state_gb = sum(p.numel() for p in model.parameters()) * BYTES_PER_PARAMETER / 1e9
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = root / "checkpoints" / "global_step_1" / "actor"
        folder.mkdir(parents=True)
        small = {"w": torch.ones(16)}
        bare_save = median_s(lambda: save(model, optimizer, folder, 1), args.repeats)
        bare_load = median_s(lambda: load(model, optimizer, folder, 1), args.repeats)
        bare_small = median_s(lambda: torch.save(small, root / "small.pt"), 200)
        config = {"save_path": str(root / "profile"), "observers": [{"name": "checkpoint"}]}
        with verl_events.install(config):
            watched_save = median_s(lambda: save(model, optimizer, folder, 1), args.repeats)
            watched_load = median_s(lambda: load(model, optimizer, folder, 1), args.repeats)
            watched_small = median_s(lambda: torch.save(small, root / "small.pt"), 200)
        described = described_s(root / "profile")
    save_cost, load_cost = watched_save - bare_save, watched_load - bare_load
    print(f"state: {args.params} M float32 parameters and two AdamW moments: {state_gb:.2f} GB")
    print(
        f"describing, by the ledger's seconds: save {described['saved']:.3f} s "
        f"({state_gb / described['saved']:.1f} GB/s), load {described['loaded']:.3f} s (the state twice)"
    )
    print(
        f"save: {bare_save:.3f} s bare, {watched_save:.3f} s watched: +{save_cost:.3f} s "
        f"({save_cost / state_gb:.2f} s per GB described, {100 * save_cost / bare_save:.0f} % of the save)"
    )
    print(
        f"load: {bare_load:.3f} s bare, {watched_load:.3f} s watched: +{load_cost:.3f} s "
        f"({load_cost / state_gb:.2f} s per GB, state described twice)"
    )
    print(f"torch.save outside a stage: {1e6 * bare_small:.0f} us bare, {1e6 * watched_small:.0f} us with the taps on")
    shard_gb = SEVEN_B * BYTES_PER_PARAMETER / 1e9 / 8
    print(
        f"7B over 8 ranks: {shard_gb:.1f} GB of state per rank: save +{shard_gb * save_cost / state_gb:.1f} s, "
        f"load +{shard_gb * load_cost / state_gb:.1f} s on a CPU like this one"
    )


if __name__ == "__main__":
    main()
