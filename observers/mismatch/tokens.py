"""One step's training-inference mismatch, token by token, from the tensors verl hands around.

At ``actor_compute_log_prob`` the trainer recomputes the log-probability of
every sampled token (``old_log_probs``, the stage's result) that the rollout
engine reported when it sampled it (``rollout_log_probs``, in the stage's
input when ``actor_rollout_ref.rollout.calculate_log_probs=True``).
:func:`measure` compares the two over the response tokens and returns one
JSON-ready mapping (the ``stats`` of a :class:`~.record.MismatchRecord`):

* ``tokens``: response tokens compared; ``nonfinite``: response tokens where
  either side is NaN or infinite (left out of everything below but verl's);
* ``log_prob`` / ``prob``: ``mean``, ``p50``, ``p90``, ``p99`` and ``max`` of
  ``|Δ log p|`` = ``|old - rollout|`` and of ``|Δ p|`` = ``|e^old - e^rollout|``;
* ``verl``: verl's own ``training/rollout_probs_diff_{max,mean,std}`` and
  ``training/rollout_actor_probs_pearson_corr``, computed as
  ``verl.utils.debug.metrics.calculate_debug_metrics`` computes them (mask
  ``response_mask``, else the last columns of ``attention_mask``; the
  standard deviation with Bessel's correction; non-finite tokens included,
  as verl includes them);
* ``by_position``: ``|Δ log p|`` by response position, in at most
  :data:`POSITION_BINS` equal bins (``start``, ``end``, ``tokens``,
  ``mean``, ``max``): drift that grows with the context;
* ``by_entropy``: the same by the trainer's entropy of the token's
  distribution, in the bins :data:`ENTROPY_EDGES` (nats): the confident,
  low-entropy tokens are where a small logit error is a large ``Δ log p``;
* ``sequence``: the per-sequence sum of ``Δ log p`` = ``old - rollout``
  (the log of the sequence-level importance ratio that truncated importance
  sampling clips): ``min``, ``max``, ``mean_abs`` and the ``worst`` row;
* ``top``: the ``top_k`` tokens with the largest ``|Δ log p|``: ``sample``
  (the row in this rank's batch), ``position`` (in the response), ``token``
  (its id), ``old`` and ``rollout`` (both log-probs), ``entropy`` (or None).

The work is a handful of reductions over the response tokens, on their
device; what comes back to the host is a few dozen numbers and the ``top_k``
rows, read one by one (on a GPU each read waits for the device; the cost is
measured by ``benchmarks/mismatch.py``).  Thread safety: no shared state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._metric_tensors import keys_for
from .._response import ResponseView, computes_reference, first_tensor
from ..metrics import as_batch
from .record import TRAINER_STAGE

if TYPE_CHECKING:
    import torch

__all__ = ["ENTROPY_EDGES", "POSITION_BINS", "QUANTILES", "StepTokens", "measure", "step_tokens"]

#: The quantiles of ``|Δ|`` each step records, by name.
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
#: At most this many response-position bins (fewer when responses are shorter).
POSITION_BINS = 8
#: Entropy bins, in nats: [0, 0.01), [0.01, 0.1), ... [4, inf).
ENTROPY_EDGES = (0.0, 0.01, 0.1, 0.5, 1.0, 2.0, 4.0, math.inf)

# Names the actor's recomputed log-probs and entropy travel under (verl 0.9's engine
# workers, its legacy workers, the CPU demo), first found wins: the sentinel's.
_OLD_KEYS = keys_for(TRAINER_STAGE, "old_log_probs")
_ENTROPY_KEYS = keys_for(TRAINER_STAGE, "entropys")


@dataclass(frozen=True, slots=True)
class StepTokens:
    """One call's tensors, padded ``[batch, response]`` and on one device."""

    old: torch.Tensor
    rollout: torch.Tensor
    mask: torch.Tensor  # bool: the response tokens
    verl_mask: torch.Tensor  # bool: the tokens verl's calculate_debug_metrics counts
    entropy: torch.Tensor | None
    tokens: torch.Tensor | None  # the sampled token ids (``responses``)


def step_tokens(result: Any, inputs: Any) -> StepTokens | str | None:
    """The tensors :func:`measure` compares, a sentence saying what is missing, or None
    for a call that computed the reference's log-probs: verl 0.9 with the reference inside
    the LoRA actor runs it through this stage with ``calculate_entropy=False``."""
    out, given = as_batch(result), as_batch(inputs) if inputs is not None else None
    if computes_reference(given):
        return None
    if out is None:
        return f"the stage returned a {type(result).__name__}, not a batch of tensors"
    rollout = first_tensor("rollout_log_probs", given, out)
    if rollout is None:
        return "the batch carries no rollout_log_probs"
    old = next((t for key in _OLD_KEYS if (t := out.tensor(key)) is not None), None)
    if old is None:
        return f"the stage returned no {_OLD_KEYS[0]} (nor {', '.join(_OLD_KEYS[1:])})"
    if rollout.is_nested or rollout.dim() != 2:
        return f"rollout_log_probs is not a padded [batch, response] tensor (shape {tuple(rollout.shape)})"
    view = ResponseView(out, given)
    aligned = view.aligned(old.detach(), rollout)
    if aligned is None:
        return "old_log_probs and rollout_log_probs do not cover the same response tokens"
    old, positions = aligned
    device = old.device
    rollout = rollout.detach().to(device)
    response_mask = view.mask_for(rollout)
    # calculate_debug_metrics: response_mask, else attention_mask's last columns, else every token.
    verl_mask = response_mask.to(device) if response_mask is not None else _everywhere(rollout)
    mask = verl_mask if positions is None else positions & verl_mask
    entropy_source = next((t for key in _ENTROPY_KEYS if (t := out.tensor(key)) is not None), None)
    entropy = None if entropy_source is None else _first(view.aligned(entropy_source.detach(), rollout))
    tokens = first_tensor("responses", given, out)
    if tokens is not None and (tokens.is_nested or tuple(tokens.shape) != tuple(rollout.shape)):
        tokens = None
    return StepTokens(old, rollout, mask, verl_mask, entropy, None if tokens is None else tokens.to(device))


def _everywhere(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.ones_like(tensor, dtype=torch.bool)


def _first(pair: tuple[torch.Tensor, Any] | None) -> torch.Tensor | None:
    return None if pair is None else pair[0]


def measure(step: StepTokens, top_k: int) -> dict[str, Any]:
    """The step's statistics (see the module docstring)."""
    import torch

    old, rollout = step.old.double(), step.rollout.double()
    finite = torch.isfinite(old) & torch.isfinite(rollout)
    keep = step.mask & finite
    delta = torch.where(keep, old - rollout, 0.0)
    gap = delta.abs()
    prob_gap = torch.where(keep, (old.exp() - rollout.exp()).abs(), 0.0)
    n = int(keep.sum())
    stats: dict[str, Any] = {"tokens": n, "nonfinite": int((step.mask & ~finite).sum()), "verl": _verl(step)}
    if n == 0:
        return stats
    kept_gap, kept_prob = gap[keep], prob_gap[keep]
    stats["log_prob"] = _summary(kept_gap)
    stats["prob"] = _summary(kept_prob)
    stats["by_position"] = _by_position(gap, keep)
    if step.entropy is not None:
        stats["by_entropy"] = _by_entropy(gap, keep & torch.isfinite(step.entropy), step.entropy.double())
    sums = delta.sum(dim=1)
    rows = keep.any(dim=1)
    if bool(rows.any()):
        worst = int(torch.where(rows, sums.abs(), -1.0).argmax())
        picked = sums[rows]
        stats["sequence"] = {
            "min": float(picked.min()),
            "max": float(picked.max()),
            "mean_abs": float(picked.abs().mean()),
            "worst": worst,
        }
    stats["top"] = _top(step, gap, keep, top_k)
    return stats


def _summary(values: torch.Tensor) -> dict[str, float]:
    import torch

    levels = torch.tensor(list(QUANTILES.values()), dtype=values.dtype, device=values.device)
    quantiles = torch.quantile(values, levels).tolist()
    return {
        "mean": float(values.mean()),
        **dict(zip(QUANTILES, quantiles, strict=True)),
        "max": float(values.max()),
    }


def _verl(step: StepTokens) -> dict[str, float]:
    """verl's ``training/rollout_*`` numbers (verl.utils.debug.metrics.calculate_debug_metrics)."""
    import torch

    mask = step.verl_mask
    if not bool(mask.any()):
        nan = math.nan
        return {"valid": 0, "probs_diff_max": nan, "probs_diff_mean": nan, "probs_diff_std": nan, "pearson_corr": nan}
    old, rollout = step.old.float().exp(), step.rollout.float().exp()
    diff = (old - rollout).abs()[mask]
    pearson = torch.corrcoef(torch.stack([old[mask], rollout[mask]]))[0][1]
    return {
        "valid": 1,
        "probs_diff_max": float(diff.max()),
        "probs_diff_mean": float(diff.mean()),
        "probs_diff_std": float(diff.std()),
        "pearson_corr": float(pearson),
    }


def _by_position(gap: torch.Tensor, keep: torch.Tensor) -> list[dict[str, Any]]:
    width = gap.shape[1]
    bins = min(POSITION_BINS, width)
    edges = [round(i * width / bins) for i in range(bins + 1)]
    rows = []
    for start, end in zip(edges, edges[1:], strict=False):
        rows.append(_bin({"start": start, "end": end}, gap[:, start:end], keep[:, start:end]))
    return rows


def _by_entropy(gap: torch.Tensor, keep: torch.Tensor, entropy: torch.Tensor) -> list[dict[str, Any]]:
    rows = []
    for low, high in zip(ENTROPY_EDGES, ENTROPY_EDGES[1:], strict=False):
        inside = keep & (entropy >= low) & (entropy < high)
        rows.append(_bin({"low": low, "high": high if math.isfinite(high) else None}, gap, inside))
    return rows


def _bin(place: dict[str, Any], gap: torch.Tensor, keep: torch.Tensor) -> dict[str, Any]:
    count = int(keep.sum())
    values = gap[keep]
    return {
        **place,
        "tokens": count,
        "mean": float(values.mean()) if count else None,
        "max": float(values.max()) if count else None,
    }


def _top(step: StepTokens, gap: torch.Tensor, keep: torch.Tensor, k: int) -> list[dict[str, Any]]:
    import torch

    if k == 0:
        return []
    ranked = torch.where(keep, gap, -1.0).flatten()
    count = min(k, int(keep.sum()))
    width = gap.shape[1]
    top = []
    for flat in torch.topk(ranked, count).indices.tolist():
        row, column = divmod(flat, width)
        top.append(
            {
                "sample": row,
                "position": column,
                "token": None if step.tokens is None else int(step.tokens[row, column]),
                "old": float(step.old[row, column]),
                "rollout": float(step.rollout[row, column]),
                "entropy": None if step.entropy is None else float(step.entropy[row, column]),
            }
        )
    return top
