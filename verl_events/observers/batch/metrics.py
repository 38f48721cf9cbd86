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

Each tensor ``T`` gives three scalars (:data:`TENSOR_STATISTICS`):
``T/nonfinite_count`` (NaN and infinite elements, padding included),
``T/abs_max`` and ``T/mean`` (over the finite values of the response
tokens).  At ``actor_compute_log_prob``, when the inputs (or the result)
carry ``rollout_log_probs``, the training-inference gap adds
``gap/log_prob_abs_max`` and ``gap/log_prob_abs_mean`` (:data:`GAP_MAX`,
:data:`GAP_MEAN`): the max and the mean over response tokens of
``|old_log_probs - rollout_log_probs|``.  What exactly each counts, which
tokens are response tokens (masks, verl 0.9's nested no-padding layout)
and what the reductions cost is documented in
:mod:`verl_events.observers.batch.tensors`, which computes them.

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
from typing import Any

from .tensors import (
    GAP_MAX,
    GAP_MEAN,
    GAP_TOKENS,
    STAGE_TENSORS,
    TENSOR_STATISTICS,
    Readings,
    read_tensors,
    reduce_tensor,
)
from .view import Batch, as_batch

__all__ = ["GAP_MAX", "GAP_MEAN", "STAGE_TENSORS", "TENSOR_STATISTICS", "extract_metrics"]

logger = logging.getLogger("verl_events.batch")

# Where verl's trainer renames an engine worker's metrics (see the module docstring).
_ROLE_PREFIX = {"actor_update": "actor/", "critic_update": "critic/"}


def extract_metrics(
    stage: str, result: Any, inputs: Any = None, reported: set[tuple[str, str]] | None = None
) -> dict[str, float]:
    """The scalars in ``result`` (and, for the gap, ``inputs``) of one ``stage``.

    Never raises: a part that cannot be read is left out, and logged at WARNING on
    ``verl_events.batch`` unless its (stage, part) is in ``reported``, the caller's record
    of failures already logged (so that a part unreadable at every step is said once).
    Tensors are not copied beyond the reductions.  See the module docstring for the names.
    """
    # It runs at the end of every stage, just after the stage's own work has
    # pushed it out of the CPU caches: few calls, few objects, no lambdas.
    readings = Readings()
    if result is None:
        return readings.values
    reported = set() if reported is None else reported

    def _report(stage: str, part: str, exc: Exception) -> None:
        if (stage, part) not in reported:
            reported.add((stage, part))
            _log_failure(stage, part, exc)

    out_batch: Batch | None = None
    try:
        out_batch = as_batch(result)
        if out_batch is None:
            _read_bare(stage, result, readings)
        else:
            _read_metrics(stage, out_batch, readings)
    except Exception as exc:
        _report(stage, "result" if out_batch is None else "metrics", exc)
    # At other stages a plain mapping's tensors were read with its metrics.
    if out_batch is not None and stage in STAGE_TENSORS and "torch" in sys.modules:
        try:
            read_tensors(stage, out_batch, as_batch(inputs) if inputs is not None else None, readings, _report)
        except Exception as exc:
            _report(stage, "tensors", exc)
    if readings.pending or readings.probes:
        try:
            readings.finish()
        except Exception as exc:
            _report(stage, "reductions", exc)
    if GAP_TOKENS in readings.values and readings.values.pop(GAP_TOKENS) == 0:  # no response token to compare
        readings.values.pop(GAP_MAX, None)
        readings.values.pop(GAP_MEAN, None)
    return readings.values


# -- scalars -----------------------------------------------------------------


def _read_bare(stage: str, value: Any, readings: Readings) -> None:
    name = f"{stage}/result"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() == 1:
            readings.add(name, value)
        elif value.is_floating_point():
            table = STAGE_TENSORS.get(stage)
            reduce_tensor(table[0][1] if table else name, value.detach(), value.detach(), None, readings)
        return
    number = _scalar(value, name)
    if number is not None:
        readings.add(name, number)


def _read_metrics(stage: str, batch: Batch, readings: Readings) -> None:
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
                reduce_tensor(name, value.detach(), value.detach(), None, readings)
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


# -- failures ----------------------------------------------------------------


def _log_failure(stage: str, part: str, exc: Exception) -> None:
    """Log a failure to read ``part`` at ``stage``; a reader never raises into training."""
    logger.warning(
        "could not read %s at stage %s (%s: %s); it is left out, and later failures of it are not logged",
        part,
        stage,
        type(exc).__name__,
        exc,
    )
