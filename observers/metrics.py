"""The scalars a watcher reads from what a verl stage returned.

:func:`extract_metrics` turns a stage's result (and the batch it was given)
into a flat ``{name: float}``.  It never raises and never keeps a tensor:
what it cannot read it leaves out, and tensors are only reduced, with one
device-to-host copy per device per call for all the reductions together
(a second one only when a tensor holds a NaN or an infinity).

Where the scalars come from, by the shape of the result
------------------------------------------------------

* verl's ``DataProto`` (its legacy workers, and what the trainer hands
  around): ``meta_info["metrics"]``, keys as verl wrote them
  (``actor/grad_norm``, ``actor/pg_loss``, ``critic/vf_loss``, ...).
* a ``TensorDict`` (verl 0.9's engine workers): the non-tensor ``metrics``
  entry.  The engine workers leave the role prefix to the trainer, so it is
  added here as ``RayPPOTrainer._update_actor`` / ``_update_critic`` add it
  (``verl.utils.py_functional.rename_dict``): at ``actor_update`` a key
  without ``actor/`` gets it (``grad_norm`` -> ``actor/grad_norm``) and
  ``mfu`` becomes ``perf/mfu/actor``; likewise ``critic/`` at
  ``critic_update``.  At ``train_batch`` (one mini-batch, actor's or
  critic's) the prefix is ``critic/`` when a key already starts with it,
  else ``actor/`` when one does, else none.  At other stages keys are read
  as they are.
* an object with a ``tensors`` mapping and a ``meta_info`` (the CPU demo's
  ``Batch``): as a DataProto.
* a plain mapping: every scalar value under its key.
* a bare number or one-element tensor: ``{stage}/result`` (the CPU demo's
  ``critic_update`` returns its loss this way; its ``actor_update`` returns a
  plain mapping of verl-named metrics).

A metric value may be a Python or numpy number, a one-element tensor, a verl
``Metric`` (its ``aggregate()``), or a list of any of these, nested (one per
micro-batch, mini-batch or data-parallel rank).  A list is reduced as verl's
``reduce_metrics`` reduces it for logging: the max when the name contains
``max``, the min when it contains ``min``, else the **mean**; a NaN anywhere
makes it NaN.  A list of ``Metric`` goes through ``Metric.aggregate_dp``, as
verl's ``train_mini_batch`` does.  Anything else (strings, bools, None) is
skipped.

Tensors
-------

Each stage produces a few tensors worth watching; they are read under one
name whatever the layout that carried them (:data:`STAGE_TENSORS`):

==========================  ===================================================  ===================
stage                       key in the result (first found)                      metric prefix
==========================  ===================================================  ===================
``rollout_generate``        ``rollout_log_probs``                                ``rollout_log_probs``
``actor_compute_log_prob``  ``old_log_probs``, ``old_log_prob``, ``log_probs``   ``old_log_probs``
                            ``entropys``, ``entropy``                            ``entropys``
                            ``rollout_log_probs`` (in the inputs)                ``rollout_log_probs``
``ref_compute_log_prob``    ``ref_log_prob``, ``log_probs``                      ``ref_log_prob``
``compute_values``          ``values``                                           ``values``
==========================  ===================================================  ===================

A bare tensor result is read as the stage's first name in the table.  At any
other stage, every floating-point tensor of a plain mapping result is read
under its own key, and a bare tensor result as ``{stage}/result``; a batch
(DataProto, TensorDict) there contributes only its metrics, since it carries
everything the step has accumulated so far.

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

verl 0.9 with the reference model inside the actor (LoRA) computes the
reference log-probs through ``actor_compute_log_prob`` too; the trainer then
sets ``calculate_entropy=False`` on the batch, and the log-probs are read as
``ref_log_prob`` with no gap.

Verified against verl 0.9.1 (``verl/workers/engine_workers.py``,
``verl/trainer/ppo/ray_trainer.py``, ``verl/workers/utils/padding.py``,
``verl/utils/debug/metrics.py``, ``verl/utils/metric/utils.py``):

* ``ActorRolloutRefWorker.update_actor`` returns
  ``TrainingWorker.train_mini_batch``'s TensorDict: no tensors, non-tensor
  ``metrics`` of lists per mini-batch (``grad_norm``, ``loss``, ``lr``,
  ``mfu``, ``actor/pg_loss``, ``perf/...``), renamed by the trainer;
* ``TrainingWorker.train_batch`` (the ``train_batch`` stage) returns the
  same shape for one mini-batch, values possibly lists over data-parallel
  ranks of floats, lists or ``Metric``;
* ``compute_log_prob`` / ``compute_ref_log_prob`` return
  ``TrainingWorker.infer_batch``'s TensorDict: nested ``log_probs`` (and
  ``entropy`` when ``calculate_entropy``) plus ``metrics``; their input is
  ``left_right_2_no_padding``'s TensorDict, which keeps ``prompts``,
  ``responses``, ``attention_mask``, ``response_mask`` and
  ``rollout_log_probs`` padded.

Thread safety: no shared state; calls may run on several threads at once.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["GAP_MAX", "GAP_MEAN", "STAGE_TENSORS", "TENSOR_STATISTICS", "extract_metrics"]

logger = logging.getLogger("verl_events.sentinel")

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

# Where verl's trainer renames an engine worker's metrics (see the module docstring).
_ROLE_PREFIX = {"actor_update": "actor/", "critic_update": "critic/"}


def extract_metrics(stage: str, result: Any, inputs: Any = None) -> dict[str, float]:
    """The scalars in ``result`` (and, for the gap, ``inputs``) of one ``stage``.

    Never raises: a part that cannot be read is left out (the first failure
    of each stage and part is logged at WARNING on ``verl_events.sentinel``).
    Tensors are not copied beyond the reductions.  See the module docstring
    for the names.
    """
    # It runs at the end of every stage, just after the stage's own work has
    # pushed it out of the CPU caches: few calls, few objects, no lambdas.
    readings = _Readings()
    if result is None:
        return readings.values
    out_batch: _Batch | None = None
    try:
        out_batch = _as_batch(result)
        if out_batch is None:
            _read_bare(stage, result, readings)
        else:
            _read_metrics(stage, out_batch, readings)
    except Exception as exc:
        _report(stage, "result" if out_batch is None else "metrics", exc)
    # At other stages a plain mapping's tensors were read with its metrics.
    if out_batch is not None and stage in STAGE_TENSORS and "torch" in sys.modules:
        try:
            _read_tensors(stage, out_batch, _as_batch(inputs) if inputs is not None else None, readings)
        except Exception as exc:
            _report(stage, "tensors", exc)
    if readings.pending or readings.probes:
        try:
            readings.finish()
        except Exception as exc:
            _report(stage, "reductions", exc)
    if _GAP_TOKENS in readings.values and readings.values.pop(_GAP_TOKENS) == 0:  # no response token to compare
        readings.values.pop(GAP_MAX, None)
        readings.values.pop(GAP_MEAN, None)
    return readings.values


# -- what a result is --------------------------------------------------------


@dataclass(slots=True)
class _Batch:
    """One result or input, seen the same way whatever carried it."""

    tensors: Any  # has .get(key, None): a dict, a TensorDict, or None
    metrics: Mapping[str, Any] | None
    kind: str  # "dataproto", "tensordict", "record" or "mapping"
    flags: Any = None  # a TensorDict whose non-tensor entries are the call's flags

    def tensor(self, key: str) -> torch.Tensor | None:
        """The tensor under ``key``; only asked once torch is imported."""
        if self.tensors is None:
            return None
        found = self.tensors.get(key, None)
        return found if isinstance(found, sys.modules["torch"].Tensor) else None


def _as_batch(value: Any) -> _Batch | None:
    """``value`` as a batch, or None for a bare value (a number, a tensor, anything else)."""
    kind = _KINDS.get(type(value))
    if kind is None:
        kind = _KINDS[type(value)] = _kind_of(value)
    if kind == "dataproto":
        info = value.meta_info
        return _Batch(value.batch, _mapping(info.get("metrics")) if isinstance(info, Mapping) else None, kind)
    if kind == "tensordict":
        metrics = _unwrap(value.get("metrics", None)) if "metrics" in value.keys() else None
        return _Batch(value, _mapping(metrics), kind, flags=value)
    if kind == "mapping":
        return _Batch(value, value, kind)
    tensors, info = getattr(value, "tensors", None), getattr(value, "meta_info", None)
    if isinstance(tensors, dict | Mapping) and isinstance(info, dict | Mapping):
        return _Batch(tensors, _mapping(info.get("metrics")), "record")
    return None


# A result's kind by its type, found once: isinstance against ABCs is slow.
_KINDS: dict[type, str] = {}


def _kind_of(value: Any) -> str:
    # Only classes already imported can have made ``value``: nothing is imported here.
    protocol = sys.modules.get("verl.protocol")
    if protocol is not None and isinstance(value, protocol.DataProto):
        return "dataproto"
    tensordict = sys.modules.get("tensordict")
    if tensordict is not None and isinstance(value, tensordict.TensorDictBase):
        return "tensordict"
    return "mapping" if isinstance(value, Mapping) else "other"


def _unwrap(value: Any) -> Any:
    """A TensorDict's non-tensor entry as the value it holds, as ``verl.utils.tensordict_utils.get`` unwraps it."""
    tensordict = sys.modules.get("tensordict")
    if tensordict is not None:
        if isinstance(value, tensordict.NonTensorStack):
            return value.tolist()
        if isinstance(value, tensordict.NonTensorData):
            return value.data
    return value


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


# -- scalars -----------------------------------------------------------------

# Carries the gap's token count through the reductions; never returned.
_GAP_TOKENS = "gap/.tokens"


class _Readings:
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
            self.values.update(zip((name for name, _ in group), numbers))


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


def _read_bare(stage: str, value: Any, readings: _Readings) -> None:
    name = f"{stage}/result"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() == 1:
            readings.add(name, value)
        elif value.is_floating_point():
            table = STAGE_TENSORS.get(stage)
            _reduce(table[0][1] if table else name, value.detach(), value.detach(), None, readings)
        return
    number = _scalar(value, name)
    if number is not None:
        readings.add(name, number)


def _read_metrics(stage: str, batch: _Batch, readings: _Readings) -> None:
    metrics = batch.metrics
    if not metrics:
        return
    prefix = _role_prefix(stage, metrics) if batch.kind == "tensordict" else ""
    torch = sys.modules.get("torch")
    for key, value in metrics.items():
        if not isinstance(key, str):
            continue
        name = key
        if prefix and key == "mfu":
            name = f"perf/mfu/{prefix[:-1]}"
        elif prefix and not key.startswith(prefix):
            name = prefix + key
        if torch is not None and isinstance(value, torch.Tensor):
            if value.numel() == 1:
                readings.add(name, value)
            elif batch.kind == "mapping" and value.is_floating_point() and stage not in STAGE_TENSORS:
                _reduce(name, value.detach(), value.detach(), None, readings)
            continue
        number = _scalar(value, name)
        if number is not None:
            readings.add(name, number)


def _role_prefix(stage: str, metrics: Mapping[str, Any]) -> str:
    if stage == "train_batch":
        keys = [key for key in metrics if isinstance(key, str)]
        return next((p for p in ("critic/", "actor/") if any(k.startswith(p) for k in keys)), "")
    return _ROLE_PREFIX.get(stage, "")


def _scalar(value: Any, name: str) -> float | None:
    """``value`` as one float (see the module docstring), or None when it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return _reduce_list(value, name)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            return None
        return float(value) if value.numel() == 1 else _reduce_list(value.tolist(), name)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        if value.dtype.kind not in "iuf":
            return None
        return float(value) if value.size == 1 else _reduce_list(value.tolist(), name)
    if _is_verl_metric(value):
        return _scalar(value.aggregate(), name)
    return None


def _is_verl_metric(value: Any) -> bool:
    """A ``verl.utils.metric.utils.Metric``, told by its shape so verl need not be imported."""
    return callable(getattr(value, "aggregate", None)) and isinstance(getattr(value, "values", None), list)


def _reduce_list(items: Any, name: str) -> float | None:
    if items and all(_is_verl_metric(item) for item in items):
        aggregate_dp = getattr(type(items[0]), "aggregate_dp", None)
        if callable(aggregate_dp):  # as verl's train_mini_batch combines the ranks' Metric
            return _scalar(aggregate_dp(list(items)), name)
    numbers: list[float] = []
    for item in _flatten(items):
        number = _scalar(item, name)
        if number is None:
            return None
        numbers.append(number)
    if not numbers:
        return None
    if any(math.isnan(n) for n in numbers):
        return math.nan
    if "max" in name:
        return max(numbers)
    if "min" in name:
        return min(numbers)
    return sum(numbers) / len(numbers)


def _flatten(items: Any) -> list[Any]:
    flat: list[Any] = []
    for item in items:
        if isinstance(item, (list, tuple)):
            flat.extend(_flatten(item))
        else:
            flat.append(item)
    return flat


# -- tensors -----------------------------------------------------------------


def _read_tensors(stage: str, out: _Batch, inputs: _Batch | None, readings: _Readings) -> None:
    as_ref = stage == "actor_compute_log_prob" and inputs is not None and _flag(inputs, "calculate_entropy") is False
    found: dict[str, torch.Tensor] = {}
    for key, name in STAGE_TENSORS[stage]:
        if as_ref and name == "old_log_probs":
            name = "ref_log_prob"
        tensor = out.tensor(key)
        if name not in found and tensor is not None and tensor.is_floating_point():
            found[name] = tensor.detach()
    gap_stage = stage == "actor_compute_log_prob" and not as_ref
    if not found and not gap_stage:
        return
    response = _ResponseView(out, inputs)
    for name, tensor in found.items():
        try:
            _reduce(name, tensor, *response.of(tensor), readings)
        except Exception as exc:
            _report(stage, name, exc)
    if not gap_stage:
        return
    rollout = _first_tensor("rollout_log_probs", inputs, out)
    if rollout is None or not rollout.is_floating_point() or rollout.is_nested:
        return
    rollout = rollout.detach()
    actor = found.get("old_log_probs")
    try:
        _reduce("rollout_log_probs", rollout, rollout, response.mask_for(rollout), readings)
        if actor is not None:
            _gap(actor, rollout, response, readings)
    except Exception as exc:
        _report(stage, "gap", exc)


def _flag(batch: _Batch, key: str) -> Any:
    if batch.flags is None or key not in batch.flags.keys():
        return None
    return _unwrap(batch.flags.get(key, None))


def _first_tensor(key: str, *batches: _Batch | None) -> torch.Tensor | None:
    for batch in batches:
        if batch is not None:
            tensor = batch.tensor(key)
            if tensor is not None:
                return tensor
    return None


class _ResponseView:
    """The response tokens of one stage's tensors, whichever layout carried them."""

    def __init__(self, out: _Batch, inputs: _Batch | None) -> None:
        self.batches = (inputs, out)
        mask = _first_tensor("response_mask", inputs, out)
        self.response_mask = mask if mask is not None and not mask.is_nested and mask.dim() == 2 else None
        self._lengths: Any = False  # not looked up yet

    def mask_for(self, padded: torch.Tensor) -> torch.Tensor | None:
        """The response tokens of a padded ``[batch, response]`` tensor: ``response_mask``
        of its shape, else the last columns of ``attention_mask``, else None (all)."""
        import torch

        mask = self.response_mask
        if mask is not None and tuple(mask.shape) == tuple(padded.shape):
            return mask.to(device=padded.device, dtype=torch.bool)
        attention = _first_tensor("attention_mask", *self.batches)
        if (
            attention is not None
            and not attention.is_nested
            and padded.dim() == 2
            and attention.dim() == 2
            and attention.shape[0] == padded.shape[0]
            and attention.shape[1] >= padded.shape[1]
        ):
            return attention[:, attention.shape[1] - padded.shape[1] :].to(device=padded.device, dtype=torch.bool)
        return None

    def of(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tokens of ``tensor`` to reduce and their mask (None: all)."""
        if not tensor.is_nested:
            return tensor, self.mask_for(tensor)
        picked = self.response_of_nested(tensor)
        return picked if picked is not None else (tensor.values(), None)

    def response_of_nested(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A nested (no-padding) tensor's response part, padded ``[batch, response]``,
        and which of its positions are response tokens; None when the lengths are unknown."""
        import torch

        if self._lengths is False:
            self._lengths = _response_lengths(*self.batches)
        lengths: torch.Tensor | None = self._lengths
        offsets: torch.Tensor = tensor.offsets()  # type: ignore[attr-defined]  # a jagged NestedTensor's
        if lengths is None or lengths.shape[0] != offsets.shape[0] - 1 or lengths.shape[0] == 0:
            return None
        values = tensor.values()
        lengths = lengths.to(device=values.device, dtype=torch.long)
        mask = self.response_mask
        width = int(mask.shape[1]) if mask is not None and mask.shape[0] == lengths.shape[0] else int(lengths.max())
        columns = torch.arange(width, device=values.device)
        valid = columns[None, :] < lengths[:, None]
        # As no_padding_2_padding: the output for response token j of a sequence
        # ending at offset e sits at e - length - 1 + j (a model predicts the next token).
        index = offsets[1:].to(device=values.device, dtype=torch.long)[:, None] - lengths[:, None] - 1 + columns[None, :]
        index = torch.where(valid, index, 0).clamp(0, values.shape[0] - 1)
        if mask is not None and tuple(mask.shape) == tuple(valid.shape):
            valid = valid & mask.to(device=values.device, dtype=torch.bool)
        return values[index], valid


def _response_lengths(*batches: _Batch | None) -> torch.Tensor | None:
    """Each sequence's response length, as no_padding_2_padding finds it."""
    responses = _first_tensor("responses", *batches)
    if responses is not None and responses.is_nested:
        offsets: torch.Tensor = responses.offsets()  # type: ignore[attr-defined]  # a jagged NestedTensor's
        return offsets.diff()
    prompts = _first_tensor("prompts", *batches)
    attention = _first_tensor("attention_mask", *batches)
    if prompts is None or attention is None or prompts.is_nested or attention.is_nested or attention.dim() != 2:
        return None
    return attention[:, prompts.shape[1] :].sum(dim=1)


def _reduce(name: str, whole: torch.Tensor, view: torch.Tensor, mask: torch.Tensor | None, readings: _Readings) -> None:
    """``name/nonfinite_count`` over every element of ``whole``; ``name/abs_max`` and
    ``name/mean`` over the finite elements of ``view`` that ``mask`` keeps.

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


def _reduce_exact(name: str, elements: torch.Tensor, view: torch.Tensor, mask: torch.Tensor | None, readings: _Readings) -> None:
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


def _gap(actor: torch.Tensor, rollout: torch.Tensor, response: _ResponseView, readings: _Readings) -> None:
    """``gap/log_prob_abs_max`` and ``gap/log_prob_abs_mean`` (see the module docstring)."""
    import torch

    if rollout.dim() != 2 or rollout.numel() == 0:
        return
    positions: torch.Tensor | None = None
    if actor.is_nested:
        picked = response.response_of_nested(actor)
        if picked is None or picked[0].shape[1] < rollout.shape[1]:
            return
        actor, positions = picked[0][:, : rollout.shape[1]], picked[1][:, : rollout.shape[1]]
    if tuple(actor.shape) != tuple(rollout.shape):
        return
    rollout = rollout.to(actor.device)
    keep = torch.isfinite(actor) & torch.isfinite(rollout)
    mask = response.mask_for(rollout)
    if mask is not None:
        keep &= mask
    if positions is not None:
        keep &= positions
    count = keep.sum()
    difference = torch.where(keep, (actor.float() - rollout.float()).abs(), 0.0)
    readings.add(_GAP_TOKENS, count)  # known on the host only after finish(); see extract_metrics
    readings.add(GAP_MAX, difference.max())
    readings.add(GAP_MEAN, difference.sum() / count.clamp(min=1))


# -- failures ----------------------------------------------------------------

_reported: set[tuple[str, str]] = set()


def _report(stage: str, part: str, exc: Exception) -> None:
    """Log the first failure to read ``part`` at ``stage``; a reader never raises into training."""
    if (stage, part) not in _reported:
        _reported.add((stage, part))
        logger.warning(
            "sentinel: could not read %s at stage %s (%s: %s); it is left out, and later failures of it are not logged",
            part,
            stage,
            type(exc).__name__,
            exc,
        )
