"""A small training loop for the fault tests, run by them as its own process.

Each step runs three stages with the timing and msprobe observers installed
(msprobe statistics at L1, the default config): ``actor_compute_log_prob``
(small, dumped), ``compute_values`` (not dumped) and ``actor_update``
(dumped, and big: ``BIG_ITERS`` multiply-and-tanh ops, two msprobe entries
each, so its session passes msprobe's periodic save at 1000 entries).
Everything is seeded: two runs with the same arguments dump the same data.

Handshakes, each a line on stdout (flushed) and then a line read from stdin:

* ``--hold``: ``INSTALLED`` once install() returned, before the first stage;
* ``--pause STEP:ITER``: ``IN STAGE`` at op ITER of step STEP's actor_update.

Other options: ``--raise-at STEP`` makes that step's actor_update raise
``Boom`` halfway, which the loop catches, printing whether it is the very
object raised; ``--failing`` adds ``fault_observers:AlwaysFails``;
``--batch N`` sets the input's first dimension, which every dump entry's
shape shows, so a dump tells which of two runs wrote it; ``--writers`` adds
two more observers that write under save_path: torch.profiler on
``compute_values`` and the third-party ``fault_observers:RunNote``.  ``max_failures``
is 3.  The last line on stdout is ``TRAINING FINISHED``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import torch

import verl_events
from verl_events import stage

BIG_ITERS = 550  # 1 + 2 * 550 entries: past msprobe's periodic save at 1000
DUMPED = ["actor_compute_log_prob", "actor_update"]
WIDTH = 8


class Boom(ValueError):
    """What --raise-at raises inside actor_update."""


RAISED: list[Boom] = []


def handshake(line: str) -> None:
    print(line, flush=True)
    sys.stdin.readline()


def config(args: argparse.Namespace) -> dict[str, Any]:
    observers: list[dict[str, Any]] = [{"name": "timing"}, {"name": "msprobe", "stages": DUMPED}]
    if args.failing:
        observers.append({"_target_": "fault_observers:AlwaysFails"})
    if args.writers:
        observers.append({"name": "torch_profiler", "stages": ["compute_values"]})
        observers.append({"_target_": "fault_observers:RunNote"})
    return {"save_path": args.save_path, "max_failures": 3, "observers": observers}


def big_stage(model: torch.nn.Module, x: torch.Tensor, step: int, args: argparse.Namespace) -> None:
    h = model(x)
    for i in range(BIG_ITERS):
        if args.pause == (step, i):
            handshake("IN STAGE")
        if args.raise_at == step and i == BIG_ITERS // 2:
            RAISED.append(Boom(f"the body of step {step} actor_update raised"))
            raise RAISED[-1]
        h = torch.tanh(h * 1.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("save_path")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--pause", type=lambda text: tuple(int(part) for part in text.split(":")))
    parser.add_argument("--raise-at", type=int)
    parser.add_argument("--failing", action="store_true")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--writers", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.manual_seed(0)
    model = torch.nn.Linear(WIDTH, WIDTH)
    x = torch.randn(args.batch, WIDTH)
    with verl_events.install(config(args)):
        if args.hold:
            handshake("INSTALLED")
        for step in range(1, args.steps + 1):
            with stage("actor_compute_log_prob", step=step, model=model):
                model(x).sum()
            with stage("compute_values", step=step, model=model):
                model(x).mean()
            try:
                with stage("actor_update", step=step, model=model):
                    big_stage(model, x, step, args)
            except Boom as exc:
                print(f"CAUGHT {'the raised object' if exc is RAISED[-1] else 'another object'}: {exc}", flush=True)
    print("TRAINING FINISHED", flush=True)


if __name__ == "__main__":
    main()
