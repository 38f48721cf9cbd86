"""The tensors a verl stage returns, reduced to the scalars :mod:`.metrics` reports.

Used by :func:`verl_events.observers.batch.metrics.extract_metrics`, which says
which tensors each stage is read for (:data:`STAGE_TENSORS`) and which
names they get; this module says what each scalar counts and what the
reductions cost; which tokens are the response tokens is :mod:`.response`'s,
shared with the mismatch observer.  Every tensor is only
reduced: one device-to-host copy per device for all the reductions of a
call (:class:`Readings`), a second one only when a tensor holds a NaN or
an infinity.

Tensor statistics
-----------------

Each tensor ``T`` gives three scalars:

* ``T/nonfinite_count``: NaN and infinite elements, over **every** element,
  padding included (verl's masked means multiply by the mask, and 0 × NaN is
  NaN, so a NaN under the mask still spreads);
* ``T/abs_max``: the largest finite |value| over the valid tokens;
* ``T/mean``: the mean of the finite values over the valid tokens (0 when
  there are none).

They cost two reductions (a sum over every element, which is NaN or
infinite whenever an element is, and a min/max over the valid tokens;
with a mask, a masked sum and count too); only when the sum or the min/max
comes back non-finite is the tensor reduced again, element by element.

The valid tokens are the response tokens: a ``response_mask`` of the same
shape (from the result or the inputs), else all elements.  In verl 0.9's
no-padding layout the tensor is nested (one row per sequence, prompt and
response together, shifted by one, as the model computed it); its response
part is picked out as ``verl.workers.utils.padding.no_padding_2_padding``
does, the response lengths taken from the inputs' ``attention_mask``
(``[:, prompts.shape[1]:]`` summed) or their nested ``responses``, and then
``response_mask`` applies.  Without those, every element of the nested
tensor counts.

The training-inference gap
--------------------------

At ``actor_compute_log_prob``, when the inputs (or the result) carry
``rollout_log_probs`` (the inference engine's log-probs of the sampled
tokens) and the result the actor's recomputed ones:

* ``gap/log_prob_abs_max``: max over response tokens of
  ``|old_log_probs - rollout_log_probs|``;
* ``gap/log_prob_abs_mean``: its mean over response tokens.

Response tokens as verl's ``calculate_debug_metrics``
(``verl.utils.debug.metrics``) picks them: ``response_mask`` when present,
else the last ``R`` columns of ``attention_mask`` (``R`` the response
length), else all; tokens where either side is not finite are left out
(``*/nonfinite_count`` reports them).  verl's own ``training/rollout_probs_diff_*``
compares probabilities; this compares log-probabilities, which shows a gap
on unlikely tokens that probabilities hide.  Nothing is reported when no
token is left.

Verified against verl 0.9.1 (``verl/workers/utils/padding.py``,
``verl/utils/debug/metrics.py``); the shapes of what verl's workers return
are listed in :mod:`verl_events.observers.batch.metrics`.

Thread safety: no shared state; calls may run on several threads at once.
Nothing here logs: :func:`read_tensors` hands a tensor (or the gap) that
cannot be read to its ``report`` and reads the others; anything else raises
to :func:`~verl_events.observers.batch.metrics.extract_metrics`, which logs it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .response import ResponseView, Source, as_padded, computes_reference, first_tensor

if TYPE_CHECKING:
    import torch

#: For each stage: (key in the stage's result, the name its metrics get), first found wins per name.
STAGE_TENSORS: Mapping[str, tuple[tuple[str, str], ...]] = MappingProxyType(
    {
        "rollout_generate": (("rollout_log_probs", "rollout_log_probs"),),
        "actor_compute_log_prob": (
            ("old_log_probs", "old_log_probs"),
            ("old_log_prob", "old_log_probs"),
            ("log_probs", "old_log_probs"),
            ("entropys", "entropys"),
            ("entropy", "entropys"),
        ),
        "ref_compute_log_prob": (("ref_log_prob", "ref_log_prob"), ("log_probs", "ref_log_prob")),
        "compute_values": (("values", "values"),),
    }
)

#: The scalars each watched tensor ``T`` gives, as ``T/<statistic>``.
TENSOR_STATISTICS = ("nonfinite_count", "abs_max", "mean")

GAP_MAX = "gap/log_prob_abs_max"
GAP_MEAN = "gap/log_prob_abs_mean"


# -- readings ----------------------------------------------------------------

# Carries the gap's token count through the reductions; never returned.
GAP_TOKENS = "gap/.tokens"


class Readings:
    """Values read so far, one-element tensors still on their device, and
    tensor statistics waiting for their fast path to be confirmed."""

    __slots__ = ("pending", "probes", "values")

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.pending: list[tuple[str, Any]] = []
        self.probes: list[_Probe] = []

    def add(self, name: str, value: Any) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            self.pending.append((name, value.detach()))
        else:
            self.values[name] = float(value)

    def finish(self) -> None:
        """Bring the pending values over; settle the probes, redoing exactly the
        tensors whose fast path met a non-finite value (a second copy, only then)."""
        self._transfer()
        unsettled = [probe for probe in self.probes if not probe.settle(self.values)]
        self.probes = []
        for probe in unsettled:
            probe.exact()
        self._transfer()

    def _transfer(self) -> None:
        """One copy per device for every pending tensor."""
        if not self.pending:
            return
        import torch

        by_device: dict[Any, list[tuple[str, torch.Tensor]]] = {}
        for name, tensor in self.pending:
            by_device.setdefault(tensor.device, []).append((name, tensor))
        self.pending = []
        for group in by_device.values():
            scalars = [t if t.dim() == 0 else t.reshape(()) for _, t in group]
            scalars = [t if t.dtype == torch.float32 else t.to(torch.float32) for t in scalars]
            numbers = torch.stack(scalars).tolist()
            self.values.update(zip((name for name, _ in group), numbers, strict=True))


@dataclass(slots=True)
class _Probe:
    """One tensor's statistics by the fast path: the sum of all its elements
    (NaN or inf if any element is), and over the valid tokens the min, max,
    sum and count.  When these are finite, no element was non-finite and they
    give the statistics; otherwise ``exact`` redoes them."""

    name: str
    exact: Any  # () -> None, adds the exact statistics to the readings

    def keys(self) -> tuple[str, str, str, str, str]:
        # No metric's last part starts with ".": these names cannot collide.
        name = self.name
        return f"{name}/.all", f"{name}/.min", f"{name}/.max", f"{name}/.sum", f"{name}/.count"

    def settle(self, values: dict[str, float]) -> bool:
        every, low, high, total, count = (values.pop(key, math.nan) for key in self.keys())
        if not math.isfinite(every + low + high + total):
            return False
        values[f"{self.name}/nonfinite_count"] = 0.0
        values[f"{self.name}/abs_max"] = max(-low, high)
        values[f"{self.name}/mean"] = total / max(count, 1.0)
        return True


# -- tensors -----------------------------------------------------------------


def read_tensors(
    stage: str, out: Source, inputs: Source | None, readings: Readings, report: Callable[[str, str, Exception], None]
) -> None:
    """Reduce the tensors :data:`STAGE_TENSORS` names for ``stage`` (and the gap at
    ``actor_compute_log_prob``); a tensor or the gap that cannot be read goes to
    ``report(stage, part, exc)`` and the others are still read.  With
    ``calculate_entropy=False`` in the inputs (verl 0.9's LoRA reference, see
    :mod:`.metrics`) the actor's log-probs are ``ref_log_prob``, with no gap."""
    as_ref = stage == "actor_compute_log_prob" and computes_reference(inputs)
    response = ResponseView(out, inputs)
    found: dict[str, torch.Tensor] = {}
    for key, name in STAGE_TENSORS[stage]:
        if as_ref and name == "old_log_probs":
            name = "ref_log_prob"
        tensor = out.tensor(key)
        # Asked of the elements: each attribute of a nested tensor costs a __torch_function__ round trip.
        if name not in found and tensor is not None and response.elements(tensor).dtype.is_floating_point:
            found[name] = tensor  # detached by the view
    gap_stage = stage == "actor_compute_log_prob" and not as_ref
    if not found and not gap_stage:
        return
    for name, tensor in found.items():
        try:
            reduce_tensor(name, response.elements(tensor), *response.of(tensor), readings)
        except Exception as exc:
            report(stage, name, exc)
    if not gap_stage:
        return
    rollout = first_tensor("rollout_log_probs", inputs, out)
    rollout = None if rollout is None else as_padded(rollout)  # verl's v1 trainer: a row per response
    if rollout is None or not rollout.is_floating_point():
        return
    rollout = rollout.detach()
    actor = found.get("old_log_probs")
    try:
        reduce_tensor("rollout_log_probs", rollout, rollout, response.mask_for(rollout), readings)
        if actor is not None:
            _gap(actor, rollout, response, readings)
    except Exception as exc:
        report(stage, "gap", exc)


def keys_for(stage: str, name: str) -> tuple[str, ...]:
    """The keys :data:`STAGE_TENSORS` reads ``stage``'s tensor ``name`` under, first found first."""
    return tuple(key for key, named in STAGE_TENSORS[stage] if named == name)


def reduce_tensor(
    name: str, whole: torch.Tensor, view: torch.Tensor, mask: torch.Tensor | None, readings: Readings
) -> None:
    """``name/nonfinite_count`` over every element of ``whole`` (a nested tensor: its
    values); ``name/abs_max`` and ``name/mean`` over the finite elements of ``view`` that
    ``mask`` keeps.

    On small tensors each torch call costs more than its arithmetic, so the
    common case, every element finite, takes two to five calls (a
    :class:`_Probe`); only a tensor with a non-finite element is redone
    exactly, by :func:`_reduce_exact`.
    """
    import torch

    elements = whole.values() if whole.is_nested else whole
    if elements.numel() == 0:
        return
    probe = _Probe(name, lambda: _reduce_exact(name, elements, view, mask, readings))
    every_key, min_key, max_key, sum_key, count_key = probe.keys()
    every = elements.sum(dtype=torch.float32)
    add = readings.pending.append  # our own results: no autograd history to detach
    add((every_key, every))
    if view.numel() == 0:
        for key in (min_key, max_key, sum_key, count_key):
            readings.values[key] = 0.0
    else:
        kept = view if mask is None else view.where(mask, 0.0)
        low, high = torch.aminmax(kept)
        add((min_key, low))
        add((max_key, high))
        add((sum_key, every if kept is elements else kept.sum(dtype=torch.float32)))
        if mask is None:
            readings.values[count_key] = float(view.numel())
        else:
            add((count_key, mask.sum()))
    readings.probes.append(probe)


def _reduce_exact(
    name: str, elements: torch.Tensor, view: torch.Tensor, mask: torch.Tensor | None, readings: Readings
) -> None:
    import torch

    finite_view = torch.isfinite(view)
    # From an int64 sum: a float32 count of finite elements rounds past 2**24 and could hide a NaN.
    finite_count = finite_view.sum() if view is elements else torch.isfinite(elements).sum()
    readings.add(f"{name}/nonfinite_count", elements.numel() - finite_count)
    if view.numel() == 0:
        return
    valid = finite_view if mask is None else finite_view & mask
    kept = view.where(valid, 0.0)
    readings.add(f"{name}/abs_max", torch.linalg.vector_norm(kept, ord=math.inf))
    readings.add(f"{name}/mean", kept.sum(dtype=torch.float32) / valid.sum().clamp(min=1))


def _gap(actor: torch.Tensor, rollout: torch.Tensor, response: ResponseView, readings: Readings) -> None:
    """``gap/log_prob_abs_max`` and ``gap/log_prob_abs_mean`` (see the module docstring)."""
    import torch

    if rollout.dim() != 2 or rollout.numel() == 0:
        return
    aligned = response.aligned(actor, rollout)
    if aligned is None:
        return
    actor, positions = aligned
    rollout = rollout.to(actor.device)
    keep = torch.isfinite(actor) & torch.isfinite(rollout)
    mask = response.mask_for(rollout)
    if mask is not None:
        keep &= mask
    if positions is not None:
        keep &= positions
    count = keep.sum()
    difference = torch.where(keep, (actor.float() - rollout.float()).abs(), 0.0)
    readings.add(GAP_TOKENS, count)  # known on the host only after finish(); see extract_metrics
    readings.add(GAP_MAX, difference.max())
    readings.add(GAP_MEAN, difference.sum() / count.clamp(min=1))
