"""The weight_sync canary's engine side on verl's inference servers: vLLM and SGLang.

    - name: weight_sync
      canary: true
      canary_engine: verl_events.observers.weight_sync.served:vllm_canary  # or :sglang_canary

verl 0.9.1's servers are named Ray actors (``vllm_server_{replica}_{node}``,
``sglang_server_{replica}_{node}``) with one ``generate(prompt_ids, sampling_params,
request_id, ...)``.  A request with ``prompt_logprobs: 0`` and ``max_tokens: 1`` returns
every prompt token's log-prob, teacher-forced, in ``extra_fields["prompt_logprobs"]``:
vLLM through ``SamplingParams.prompt_logprobs`` (verl's ``extract_prompt_logprobs``),
SGLang by turning the same key into ``return_logprob`` with ``logprob_start_len=0``
(verl's ``_extract_prompt_logprobs_sglang``).  One row per prompt position: row ``i`` is
the log-prob of token ``i + 1`` (the first position has none), and a last ``[0.0]`` row
pads the list to the prompt's length.  Both compute them from the raw logits, without the
request's temperature, as the trainer's side of the canary does.

These servers give no layer outputs: the canary compares log-probs, and an alarm names no
layer.  The server is the trainer rank's replica when one is named like the rank (one
replica per rank), else replica 0.  Neither engine runs on the machine these were written
on: tests/test_served_canary.py checks the calls against verl 0.9.1's own source of both
servers, not against a running engine.

An engine adapter of the observer, so it lives beside it.  It was
``verl_events.apps.served_canary``, which re-exports it, with a DeprecationWarning, until
0.3.  Ray and torch are imported when a canary runs, not with this module.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .canary import Side

__all__ = ["SAMPLING", "canary_request", "sglang_canary", "side_from_outputs", "vllm_canary"]

#: One token generated (the least a server accepts), every prompt token's own log-prob.
SAMPLING = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}


def canary_request(prompt_ids: list[int]) -> dict[str, Any]:
    """The keyword arguments of one ``generate`` call for one canary sequence."""
    return {
        "prompt_ids": list(prompt_ids),
        "sampling_params": dict(SAMPLING),
        "request_id": f"verl-events-canary-{uuid.uuid4().hex}",
    }


def side_from_outputs(outputs: list[Any], ids: list[list[int]]) -> Side:
    """The engine's side from the servers' ``TokenOutput`` replies, one per sequence of ``ids``."""
    import torch

    from .canary import Side

    rows = []
    for output, sequence in zip(outputs, ids, strict=True):
        found = (output.extra_fields or {}).get("prompt_logprobs")
        if found is None or len(found) != len(sequence):
            got = "none" if found is None else f"{len(found)} rows"
            raise ValueError(
                f"the server returned {got} of prompt_logprobs for a {len(sequence)}-token canary "
                "sequence; it should return one per prompt token"
            )
        rows.append([float(row[0]) for row in found[:-1]])  # the last row is padding
    return Side(torch.tensor(rows, dtype=torch.float64), [])


def vllm_canary(rank: int, ids: list[list[int]]) -> Side:
    """The canary through trainer ``rank``'s vLLM server (see the module docstring)."""
    return _served_canary("vllm_server", rank, ids)


def sglang_canary(rank: int, ids: list[list[int]]) -> Side:
    """The canary through trainer ``rank``'s SGLang server (see the module docstring)."""
    return _served_canary("sglang_server", rank, ids)


def _served_canary(prefix: str, rank: int, ids: list[list[int]]) -> Side:
    import ray

    try:
        server = ray.get_actor(f"{prefix}_{rank}_0")
    except ValueError:  # Ray's answer for a name no actor has
        server = ray.get_actor(f"{prefix}_0_0")
    outputs = ray.get([server.generate.remote(**canary_request(sequence)) for sequence in ids])
    return side_from_outputs(outputs, ids)
