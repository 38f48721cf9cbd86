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

The work is a few dozen torch operations over the response tokens, on
their device, whatever the batch size (bins and rows are reduced together,
not one by one: on a small batch each operation costs more than its
arithmetic); what comes back to the host is a few dozen numbers and the
``top_k`` rows, in two copies (:class:`~verl_events.observers._reads.Reads`;
on a GPU each copy waits for the device).  The cost is measured by
``benchmarks/mismatch.py``.  Thread safety: no shared state.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._reads import Reads
from ..batch import ResponseView, as_batch, as_on, as_padded, computes_reference, first_tensor, keys_for
from .record import NO_ROLLOUT_LOG_PROBS, TRAINER_STAGE

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
        return NO_ROLLOUT_LOG_PROBS
    old = next((t for key in _OLD_KEYS if (t := out.tensor(key)) is not None), None)
    if old is None:
        return f"the stage returned no {_OLD_KEYS[0]} (nor {', '.join(_OLD_KEYS[1:])})"
    rollout = as_padded(rollout)  # verl's v1 trainer hands it jagged, a row per response
    if rollout.dim() != 2:
        return f"rollout_log_probs is not a [batch, response] tensor (shape {tuple(rollout.shape)})"
    view = ResponseView(out, given)
    aligned = view.aligned(old, rollout)  # detached by the view
    if aligned is None:
        return "old_log_probs and rollout_log_probs do not cover the same response tokens"
    old, positions = aligned
    device = old.device
    rollout = as_on(rollout.detach(), device)
    response_mask = view.mask_for(rollout)
    # calculate_debug_metrics: response_mask, else attention_mask's last columns, else every token.
    verl_mask = as_on(response_mask, device) if response_mask is not None else _everywhere(rollout)
    mask = verl_mask if positions is None else positions & verl_mask
    entropy_source = next((t for key in _ENTROPY_KEYS if (t := out.tensor(key)) is not None), None)
    entropy_aligned = None if entropy_source is None else view.aligned(entropy_source, rollout)
    entropy = None if entropy_aligned is None else entropy_aligned[0]
    tokens = first_tensor("responses", given, out)
    tokens = None if tokens is None else as_padded(tokens)
    if tokens is not None and tuple(tokens.shape) != tuple(rollout.shape):
        tokens = None
    return StepTokens(old, rollout, mask, verl_mask, entropy, None if tokens is None else as_on(tokens, device))


def _everywhere(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.ones_like(tensor, dtype=torch.bool)


def measure(step: StepTokens, top_k: int) -> dict[str, Any]:
    """The step's statistics (see the module docstring)."""
    import torch

    old, rollout = step.old.double(), step.rollout.double()
    finite = torch.isfinite(old) & torch.isfinite(rollout)
    keep = step.mask & finite
    # Two reads from the device in all: these counts, which decide what follows, then every number at once.
    n, in_mask, verl_count = torch.stack([keep.sum(), step.mask.sum(), step.verl_mask.sum()]).tolist()
    stats: dict[str, Any] = {"tokens": n, "nonfinite": in_mask - n}
    reads = Reads()
    verl = _verl(step, reads) if verl_count else None
    if n == 0:
        reads.fetch()
        stats["verl"] = dict(_NO_VERL) if verl is None else verl()
        return stats
    delta = torch.where(keep, old - rollout, 0.0)
    gap = delta.abs()
    prob_gap = torch.where(keep, (old.exp() - rollout.exp()).abs(), 0.0)
    summaries = _summaries(torch.stack([gap[keep], prob_gap[keep]]), reads)
    by_position = _by_position(gap, keep, reads)
    by_entropy = None if step.entropy is None else _by_entropy(gap, keep, step.entropy, reads)
    sequence = _sequence(delta, keep, reads)
    top = _top(step, old, rollout, gap, keep, min(top_k, n), reads)
    reads.fetch()
    stats["verl"] = dict(_NO_VERL) if verl is None else verl()
    stats["log_prob"], stats["prob"] = summaries()
    stats["by_position"] = by_position()
    if by_entropy is not None:
        stats["by_entropy"] = by_entropy()
    stats["sequence"] = sequence()
    stats["top"] = top()
    return stats


_VERL_NAMES = ("probs_diff_max", "probs_diff_mean", "probs_diff_std", "pearson_corr")
_NO_VERL = {"valid": 0, **dict.fromkeys(_VERL_NAMES, math.nan)}


def _summaries(both: torch.Tensor, reads: Reads) -> Callable[[], tuple[dict[str, float], dict[str, float]]]:
    """Mean, quantiles and max of each row of ``both`` (|Δ log p| and |Δ p| of the kept tokens).

    The quantiles are ``torch.quantile``'s (linear): of the sorted row, the values at
    ``floor(q (n - 1))`` and ``ceil(q (n - 1))`` and their ``lerp`` by the fraction; the
    two values are read with the other numbers and interpolated on the host, which spares
    quantile's own checks (a dozen operations, the dearest of the hook on a small batch).
    """
    count = both.shape[1]
    ranks = [q * (count - 1) for q in QUANTILES.values()]
    places = [int(rank) for rank in ranks] + [math.ceil(rank) for rank in ranks]
    numbers = reads.add(both.mean(dim=1))
    bounds = reads.add(both.sort(dim=1).values[:, places])
    highs = reads.add(both.amax(dim=1))

    def summaries() -> tuple[dict[str, float], dict[str, float]]:
        means, ends, maxima = numbers(), bounds(), highs()
        size = len(ranks)
        rows = []
        for row in range(2):
            below, above = (
                ends[2 * size * row : 2 * size * row + size],
                ends[2 * size * row + size : 2 * size * (row + 1)],
            )
            quantiles = [_lerp(b, a, rank - int(rank)) for b, a, rank in zip(below, above, ranks, strict=True)]
            rows.append({"mean": means[row], **dict(zip(QUANTILES, quantiles, strict=True)), "max": maxima[row]})
        return rows[0], rows[1]

    return summaries


def _lerp(start: float, end: float, weight: float) -> float:
    """``torch.lerp``'s formula."""
    return start + weight * (end - start) if abs(weight) < 0.5 else end - (end - start) * (1 - weight)


def _verl(step: StepTokens, reads: Reads) -> Callable[[], dict[str, float]]:
    """verl's ``training/rollout_*`` numbers (verl.utils.debug.metrics.calculate_debug_metrics),
    for a mask with at least one token."""
    import torch

    # Each side's exp in its own dtype, as verl's: its v1 trainer keeps the actor's log-probs in
    # bfloat16, and its figures carry that rounding (8.2e-5 where float32 gives 8.7e-5).
    old, rollout = step.old.exp()[step.verl_mask], step.rollout.exp()[step.verl_mask]
    diff = (old - rollout).abs()
    probs = torch.stack([old.float(), rollout.float()])
    # verl's Pearson correlation is torch.corrcoef's; its covariance matrix is a matrix product,
    # which on a CPU with several threads waits for the BLAS library's threads to wake
    # (milliseconds on a busy machine) for two numbers.  Here: its sums of products, in float64
    # (verl's float32 figure is within its own rounding of this one), divided on the host.
    both = probs.double()
    centred = both - both.mean(dim=1, keepdim=True)
    products = (centred[:, None, :] * centred[None, :, :]).sum(dim=2).reshape(-1)  # xx, xy, yx, yy
    numbers = reads.add(torch.cat([torch.stack([diff.max(), diff.mean(), diff.std()]).double(), products]))
    count = int(old.shape[0])

    def verl() -> dict[str, float]:
        high, mean, std, xx, xy, _, yy = numbers()
        return {
            "valid": 1,
            "probs_diff_max": high,
            "probs_diff_mean": mean,
            "probs_diff_std": std,
            "pearson_corr": _pearson(xy, xx, yy, count),
        }

    return verl


def _pearson(xy: float, xx: float, yy: float, count: int) -> float:
    """What ``torch.corrcoef`` makes of the centred sums of products of ``count`` pairs:
    covariances over ``count - 1``, divided by both standard deviations, clipped to [-1, 1];
    NaN where torch divides zero by zero."""
    if count < 2 or xx == 0 or yy == 0:
        return math.nan
    correlation = (xy / (count - 1)) / math.sqrt(xx / (count - 1)) / math.sqrt(yy / (count - 1))
    return correlation if math.isnan(correlation) else max(-1.0, min(1.0, correlation))


def _by_position(gap: torch.Tensor, keep: torch.Tensor, reads: Reads) -> Callable[[], list[dict[str, Any]]]:
    import torch

    in_bin, places = _position_bins(gap.shape[1], gap.device)
    # Each column's count, sum and max first, then the columns of each bin together.
    counts = keep.sum(dim=0)[:, None]
    numbers = reads.add(
        torch.stack(
            [
                torch.where(in_bin, counts, 0).sum(dim=0),
                torch.where(in_bin, gap.sum(dim=0)[:, None], 0.0).sum(dim=0),
                torch.where(in_bin, torch.where(keep, gap, -math.inf).amax(dim=0)[:, None], -math.inf).amax(dim=0),
            ]
        )
    )
    return lambda: _bins(places, numbers())


@functools.lru_cache(maxsize=16)
def _position_bins(width: int, device: torch.device) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """Which of the at most :data:`POSITION_BINS` equal bins holds each of ``width`` columns
    (``[width, bins]``, bool), and each bin's start and end."""
    import torch

    bins = min(POSITION_BINS, width)
    edges = [round(i * width / bins) for i in range(bins + 1)]
    inner = torch.tensor(edges[1:-1], dtype=torch.long, device=device)
    column_bin = torch.bucketize(torch.arange(width, device=device), inner, right=True)
    places = [{"start": start, "end": end} for start, end in zip(edges, edges[1:], strict=False)]
    return column_bin[:, None] == torch.arange(bins, device=device), places


def _by_entropy(
    gap: torch.Tensor, keep: torch.Tensor, entropy: torch.Tensor, reads: Reads
) -> Callable[[], list[dict[str, Any]]]:
    import torch

    entropy = entropy.double()
    bins = len(ENTROPY_EDGES) - 1
    # Each kept token with a finite entropy (>= 0, the first edge) goes to its bin, the others
    # to one more; then each bin's count, sum and max in one pass each (scatter_add_ and amax
    # are deterministic on a GPU too: torch.use_deterministic_algorithms allows them).
    valid = keep & torch.isfinite(entropy) & (entropy >= ENTROPY_EDGES[0])
    index = torch.where(valid, torch.bucketize(entropy, _entropy_inner_edges(gap.device), right=True), bins)
    index, values = index.reshape(-1), gap.reshape(-1)
    numbers = reads.add(
        torch.stack(
            [
                torch.bincount(index, minlength=bins + 1).double(),
                gap.new_zeros(bins + 1).scatter_add_(0, index, values),
                gap.new_full((bins + 1,), -math.inf).scatter_reduce_(0, index, values, "amax"),
            ]
        )[:, :bins]
    )
    return lambda: _bins(_ENTROPY_PLACES, numbers())


_ENTROPY_PLACES = [
    {"low": low, "high": high if math.isfinite(high) else None}
    for low, high in zip(ENTROPY_EDGES, ENTROPY_EDGES[1:], strict=False)
]


@functools.lru_cache(maxsize=4)
def _entropy_inner_edges(device: torch.device) -> torch.Tensor:
    """The edges between the entropy bins, on ``device``."""
    import torch

    return torch.tensor(ENTROPY_EDGES[1:-1], dtype=torch.float64, device=device)


def _bins(places: list[dict[str, Any]], numbers: list[float]) -> list[dict[str, Any]]:
    """Each bin's place, token count, mean and max (None for an empty bin) from the
    counts, sums and maxima of every bin, in that order."""
    size = len(places)
    rows = []
    for place, count, total, top in zip(
        places, numbers[:size], numbers[size : 2 * size], numbers[2 * size :], strict=True
    ):
        tokens = int(count)
        rows.append(
            {**place, "tokens": tokens, "mean": total / tokens if tokens else None, "max": top if tokens else None}
        )
    return rows


def _sequence(delta: torch.Tensor, keep: torch.Tensor, reads: Reads) -> Callable[[], dict[str, Any]]:
    """The per-sequence sums of Δ log p over the rows with a kept token (there is one)."""
    import torch

    sums = delta.sum(dim=1)
    rows = keep.any(dim=1)
    magnitude = sums.abs()
    numbers = reads.add(
        torch.stack(
            [
                torch.where(rows, sums, math.inf).min(),
                torch.where(rows, sums, -math.inf).max(),
                torch.where(rows, magnitude, 0.0).sum() / rows.sum(),
                torch.where(rows, magnitude, -1.0).argmax(),
            ]
        )
    )

    def sequence() -> dict[str, Any]:
        low, high, mean_abs, worst = numbers()
        return {"min": low, "max": high, "mean_abs": mean_abs, "worst": int(worst)}

    return sequence


def _top(
    step: StepTokens,
    old: torch.Tensor,
    rollout: torch.Tensor,
    gap: torch.Tensor,
    keep: torch.Tensor,
    count: int,
    reads: Reads,
) -> Callable[[], list[dict[str, Any]]]:
    """The ``count`` kept tokens with the largest |Δ log p|, largest first."""
    import torch

    if count == 0:
        return lambda: []
    flat = torch.topk(torch.where(keep, gap, -1.0).flatten(), count).indices
    columns = [flat, old.flatten()[flat], rollout.flatten()[flat]]
    if step.entropy is not None:
        columns.append(step.entropy.flatten()[flat])
    if step.tokens is not None:
        columns.append(step.tokens.flatten()[flat])  # ids far below 2**53: exact as float64
    numbers = reads.add(torch.stack([column.double() for column in columns], dim=1))
    width = gap.shape[1]

    def top() -> list[dict[str, Any]]:
        values, fields = numbers(), len(columns)
        rows = []
        for at in range(0, len(values), fields):
            flat_index, old_value, rollout_value, *rest = values[at : at + fields]
            row, column = divmod(int(flat_index), width)
            entropy = rest.pop(0) if step.entropy is not None else None
            rows.append(
                {
                    "sample": row,
                    "position": column,
                    "token": int(rest[0]) if step.tokens is not None else None,
                    "old": old_value,
                    "rollout": rollout_value,
                    "entropy": entropy,
                }
            )
        return rows

    return top
