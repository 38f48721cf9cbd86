"""The mismatch observer's cost per ``actor_compute_log_prob``, by batch size.

    python benchmarks/mismatch.py [--repeats 20]

Times what the observer does at the end of each stage it watches: find the tensors
(:func:`step_tokens`) and measure them (:func:`measure`, top_k 8), on CPU float32 tensors
of verl's padded shapes ``[batch, response]`` with a random response mask.  Sizes: the CPU
job's batch (4 x 8, 1 or 2 ranks), and batches per rank of a real run (64 x 1024 and
256 x 4096, a million response tokens).  Prints the median and the fastest of
``--repeats`` calls per size, and the cost per thousand tokens.  The share of a real step
is in tests/test_verl_mismatch.py's ``test_what_the_observer_costs_a_step`` (printed) and
docs/performance.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verl_events.observers.mismatch.tokens import measure, step_tokens

SIZES = ((4, 8), (64, 1024), (256, 4096))


def batch(rows: int, width: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    rollout = -torch.rand(rows, width, generator=generator) * 8
    old = rollout + torch.randn(rows, width, generator=generator) * 1e-3
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    entropy = torch.rand(rows, width, generator=generator) * 4
    tokens = torch.randint(0, 150_000, (rows, width), generator=generator)
    return {"old_log_probs": old, "entropys": entropy}, {
        "rollout_log_probs": rollout,
        "response_mask": mask,
        "responses": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for rows, width in SIZES:
        result, inputs = batch(rows, width)
        tokens = int(inputs["response_mask"].sum())
        seconds = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            measure(step_tokens(result, inputs), top_k=8)  # type: ignore[arg-type]
            seconds.append(time.perf_counter() - started)
        median = statistics.median(seconds)
        print(
            f"batch {rows:>3} x {width:<4} ({tokens:>7} response tokens): median {median * 1e3:8.2f} ms, "
            f"fastest {min(seconds) * 1e3:8.2f} ms, {median * 1e6 / tokens * 1e3:7.1f} us per 1000 tokens"
        )


if __name__ == "__main__":
    main()
