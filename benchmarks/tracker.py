"""What the tracker observer costs per stage, for each backend, on stages that do nothing.

    .venv/bin/python benchmarks/tracker.py    # --steps 200 --stages 7

For each configuration a fresh installation (save_path in a temporary folder)
runs ``--steps`` steps of ``--stages`` empty stages (verl's seven names), after
one step whose time is printed apart: the first send of a rank, at the end of
its first stage, opens the backend's run (W&B starts its service, TensorBoard
its writer thread).  The
configurations: ``bare`` (nothing installed: an emit that nobody hears), then the tracker alone with each
backend — ``tensorboard``, ``wandb`` (``mode: offline``) and ``mlflow`` (a local
file store: no server, so it measures the client, not the network).  The
tracker's work runs in the bus's report hook, which the timing log does not
time; hence this script.  Prints per configuration the microseconds per stage
over bare and the step that opened the run, and ends with::

    tracker_us_per_stage tensorboard=<us> wandb=<us> mlflow=<us>

Wall clock, best of ``--repeats`` (default 3) runs each.  A backend whose
library is not installed is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import verl_events
from verl_events import stage

STAGES = (
    "rollout_generate",
    "compute_rm_score",
    "ref_compute_log_prob",
    "actor_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
)
BACKENDS: dict[str, dict[str, Any]] = {
    "tensorboard": {},
    "wandb": {"wandb": {"mode": "offline"}},
    "mlflow": {"mlflow": {"tracking_uri": "file:{root}/mlruns"}},
}
LIBRARIES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def run(backend: str | None, steps: int, stages: tuple[str, ...]) -> tuple[float, float]:
    """(seconds per stage over the timed steps, seconds of the step that opened the run)."""
    with tempfile.TemporaryDirectory() as root:
        installation: Any = contextlib.nullcontext()
        if backend is not None:
            options = {k: {o: str(v).format(root=root) for o, v in d.items()} for k, d in BACKENDS[backend].items()}
            tracker = {"name": "tracker", "backends": [backend], **options}
            installation = verl_events.install({"save_path": str(Path(root) / "out"), "observers": [tracker]})
        with installation:
            started = time.perf_counter()
            for name in stages:  # step 1's first stage opens the run
                with stage(name, step=1):
                    pass
            opening = time.perf_counter() - started
            started = time.perf_counter()
            for step in range(2, steps + 2):
                for name in stages:
                    with stage(name, step=step):
                        pass
            elapsed = time.perf_counter() - started
    return elapsed / (steps * len(stages)), opening


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--stages", type=int, default=len(STAGES), choices=range(1, len(STAGES) + 1))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's opt-in for a local file store
    stages = STAGES[: args.stages]
    bare = min(run(None, args.steps, stages)[0] for _ in range(args.repeats))
    print(f"bare: {bare * 1e6:.1f} us per stage")
    costs = {}
    for backend in BACKENDS:
        if importlib.util.find_spec(LIBRARIES[backend]) is None:
            print(f"backend {backend}: not installed, skipped")
            continue
        results = [run(backend, args.steps, stages) for _ in range(args.repeats)]
        per_stage = min(r[0] for r in results)
        opening = min(r[1] for r in results)
        costs[backend] = (per_stage - bare) * 1e6
        print(
            f"backend {backend}: {per_stage * 1e6:.1f} us per stage ({costs[backend]:.1f} over bare; "
            f"{costs[backend] * len(stages):.0f} us per step), the step that opened the run {opening * 1e3:.1f} ms"
        )
    print("tracker_us_per_stage " + " ".join(f"{name}={cost:.1f}" for name, cost in costs.items()))


if __name__ == "__main__":
    main()
