"""The mismatch observer's cost per ``actor_compute_log_prob``, by batch size and layout.

    python benchmarks/mismatch.py [--repeats 20] [--threads N]

Times what the observer does at the end of each stage it watches: find the tensors
(:func:`step_tokens`) and measure them (:func:`measure`, top_k 8), on CPU tensors in the
two layouts verl hands the stage:

- ``padded``: float32 ``[batch, response]`` with a random response mask (verl's legacy
  workers, the trainer's DataProto);
- ``nested``: verl 0.9's engine workers, what the CPU job's worker really holds: the inputs
  made by verl's own ``left_right_2_no_padding`` (prompts left-padded, responses right-padded,
  random lengths), the result's ``log_probs`` and ``entropy`` nested bfloat16 tensors over
  prompt and response, as ``TrainingWorker.infer_batch`` returns them.

Sizes: the CPU job's batch (4 x 8 response tokens, 16-token prompts) and batches per rank of
a real run (64 x 1024 and 256 x 4096, a million response tokens). For the nested layout a
second figure, ``sentinel + mismatch``, times both observers at the same stage end, as the
always_on preset runs them (the sentinel's :func:`extract_metrics` first): the mismatch
observer then finds the response tokens the sentinel already picked out of the nested
log-probs (verl_events/observers/batch/response.py). Each call starts with that kept work forgotten, so no
call finds the previous call's.

Prints the median and the fastest of ``--repeats`` calls per case, and the cost per thousand
response tokens. ``--threads`` sets torch's threads (default: torch's own; verl's CPU worker
runs one). The share of a real step is ``benchmarks/verl_trainer.py --variants
none,always_on``'s and docs/performance.md's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from verl_events.observers.batch import extract_metrics, response
from verl_events.observers.mismatch.tokens import measure, step_tokens

SIZES = ((4, 8), (64, 1024), (256, 4096))
PROMPT = 16  # the CPU job's max_prompt_length


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


def nested_batch(rows: int, width: int) -> tuple[Any, Any]:
    """(result, inputs) of verl 0.9's engine worker's compute_log_prob, built with verl's code."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    generator = torch.Generator().manual_seed(0)
    prompt_lengths = torch.randint(1, PROMPT + 1, (rows,), generator=generator)
    response_lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    prompt_mask = (torch.arange(PROMPT)[None, :] >= PROMPT - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(width)[None, :] < response_lengths[:, None]).long()
    prompts = torch.randint(1, 150_000, (rows, PROMPT), generator=generator) * prompt_mask
    responses = torch.randint(1, 150_000, (rows, width), generator=generator) * response_mask
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    rollout = -torch.rand(rows, width, generator=generator) * 8 * response_mask
    padded = DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "response_mask": response_mask,
            "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
            "rollout_log_probs": rollout,
        }
    )
    inputs = left_right_2_no_padding(padded.to_tensordict())
    tu.assign_non_tensor(inputs, compute_loss=False, calculate_entropy=True)
    offsets = inputs["input_ids"].offsets()
    total = int(offsets[-1])

    def nested(values: torch.Tensor) -> torch.Tensor:
        return torch.nested.nested_tensor_from_jagged(values.to(torch.bfloat16), offsets=offsets)

    log_probs = nested(-torch.rand(total, generator=generator) * 8)
    entropy = nested(torch.rand(total, generator=generator) * 4)
    result = tu.get_tensordict(
        tensor_dict={"log_probs": log_probs, "entropy": entropy}, non_tensor_dict={"metrics": {}}
    )
    return result, inputs


def timed(call: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(median, fastest) seconds of ``call``, each call with the kept alignments forgotten."""
    seconds = []
    for _ in range(repeats):
        response._PICKED.clear()
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), min(seconds)


def report(label: str, tokens: int, median: float, fastest: float) -> None:
    print(
        f"{label:<40} ({tokens:>7} response tokens): median {median * 1e3:8.2f} ms, "
        f"fastest {fastest * 1e3:8.2f} ms, {median * 1e6 / tokens * 1e3:7.1f} us per 1000 tokens"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for rows, width in SIZES:
        result, inputs = batch(rows, width)
        tokens = int(inputs["response_mask"].sum())

        def mismatch(result: Any = result, inputs: Any = inputs) -> None:
            measure(step_tokens(result, inputs), top_k=8)  # type: ignore[arg-type]

        report(f"padded {rows:>3} x {width:<4} mismatch", tokens, *timed(mismatch, args.repeats))
    for rows, width in SIZES:
        result, inputs = nested_batch(rows, width)
        tokens = int(inputs["response_mask"].sum())

        def nested_mismatch(result: Any = result, inputs: Any = inputs) -> None:
            measure(step_tokens(result, inputs), top_k=8)  # type: ignore[arg-type]

        def both(result: Any = result, inputs: Any = inputs) -> None:
            extract_metrics("actor_compute_log_prob", result, inputs)
            nested_mismatch(result, inputs)

        report(f"nested {rows:>3} x {width:<4} mismatch", tokens, *timed(nested_mismatch, args.repeats))
        report(f"nested {rows:>3} x {width:<4} sentinel + mismatch", tokens, *timed(both, args.repeats))


if __name__ == "__main__":
    main()
