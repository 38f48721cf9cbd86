"""Where engine and trainer part: one step's layer profile from two msprobe tensor dumps.

The trainer side is the step's ``actor_compute_log_prob`` session (its
replay's when there is one: the step that raised the anomaly, run again);
the engine side is the step's ``rollout_prefill`` session, which the rollout
engine wrote when the mismatch observer handed it the same sequences
(``prefill_steps``).  Both must be msprobe dumps of task ``tensor`` at level
``L0`` or ``mix`` (``config_path: tensor_L0``): the profile needs the
outputs themselves, not their statistics.

A module is matched by its path in the model (``model.layers.0.self_attn``)
and its call number, not by its class: FSDP2 renames the classes it wraps
(``FSDPQwen2DecoderLayer``); the path parts FSDP1, activation checkpointing
and torch.compile insert (``_fsdp_wrapped_module``, ...) are dropped (checked
with FSDP2 only).  Call ``k`` on both sides must be the same
sequence: the engine prefills one sequence per forward in the batch's
order, so the trainer must run one per forward too
(``log_prob_micro_batch_size_per_gpu=1``, ``actor.use_dynamic_bsz=False``); a call
whose shapes differ is refused with that advice.

For each module, over all its calls, with the trainer's output ``t`` and the
engine's ``e`` (float64)::

    relative error = sqrt(sum ||e - t||^2 / sum ||t||^2)

listed in the trainer's order (the order modules finish, children before
their parent).  **Layers** are the modules no other listed module contains
(``model.embed_tokens``, ``model.layers.N``, ``model.norm``): the first layer
past ``tolerance`` (a NaN or infinite error is past it) is where the error
enters; the layer whose error is the largest multiple of the layer before it
in the residual stream (the last layer with outputs as wide) is where it
grows most.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_events.layout import replay_dir_name, stage_dir
from verl_events.observers.mismatch import record as mismatch_record
from verl_events.observers.msprobe import layout

from .summary import MismatchInputError

__all__ = ["DEFAULT_TOLERANCE", "ENGINE_STAGE", "TRAINER_STAGE", "LayerError", "LayerProfile", "layer_profile"]

TRAINER_STAGE = mismatch_record.TRAINER_STAGE
ENGINE_STAGE = mismatch_record.ENGINE_STAGE
#: 1e-3: far above float32 rounding through a few layers (about 1e-6), below bfloat16's relative precision (2^-8).
DEFAULT_TOLERANCE = 1e-3

_FORWARD = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.forward\.(?P<call>\d+)$")
# Path parts a wrapper adds (FSDP1, activation checkpointing, torch.compile): the module is the same.
_WRAPPERS = re.compile(r"(^|\.)(_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)(?=\.|$)")


@dataclass(slots=True)
class LayerError:
    """One module's relative error over its calls."""

    module: str
    calls: int
    error: float
    shape: tuple[int, ...] = ()  # the trainer's output shape at the first call
    layer: bool = False  # no other listed module contains it
    growth: float | None = None  # layers only: this error over the layer before's


@dataclass(slots=True)
class LayerProfile:
    step: int
    rank: int
    trainer: Path  # the dump.json of each side
    engine: Path
    tolerance: float
    modules: list[LayerError] = field(default_factory=list)
    only_trainer: list[str] = field(default_factory=list)  # modules one side ran and the other did not
    only_engine: list[str] = field(default_factory=list)

    @property
    def layers(self) -> list[LayerError]:
        return [m for m in self.modules if m.layer]

    @property
    def first_past(self) -> LayerError | None:
        """The first layer past the tolerance; a NaN or infinite error is past it too."""
        return next((m for m in self.layers if not m.error <= self.tolerance), None)

    @property
    def grows_most(self) -> LayerError | None:
        grown = [m for m in self.layers if m.growth is not None and m.growth > 1]
        return max(grown, key=lambda m: m.growth or 0.0, default=None)

    def as_json(self) -> dict[str, Any]:
        first, grows = self.first_past, self.grows_most
        return {
            "step": self.step,
            "rank": self.rank,
            "trainer": str(self.trainer),
            "engine": str(self.engine),
            "tolerance": self.tolerance,
            "first_past_tolerance": first.module if first else None,
            "grows_most": grows.module if grows else None,
            "modules": [
                {"module": m.module, "calls": m.calls, "error": m.error, "layer": m.layer, "growth": m.growth}
                for m in self.modules
            ],
            "only_trainer": self.only_trainer,
            "only_engine": self.only_engine,
        }


def layer_profile(run: Path, step: int, rank: int = 0, tolerance: float = DEFAULT_TOLERANCE) -> LayerProfile:
    """The profile of ``step`` on ``rank`` (see the module docstring); MismatchInputError for a
    missing or unusable dump."""
    trainer = _dump(run, step, rank, TRAINER_STAGE)
    engine = _dump(run, step, rank, ENGINE_STAGE)
    t_outputs, e_outputs = _outputs(trainer), _outputs(engine)
    profile = LayerProfile(step, rank, trainer, engine, tolerance)
    profile.only_trainer = [m for m in t_outputs if m not in e_outputs]
    profile.only_engine = [m for m in e_outputs if m not in t_outputs]
    for module, t_calls in t_outputs.items():
        e_calls = e_outputs.get(module)
        if e_calls is None:
            continue
        if len(t_calls) != len(e_calls):
            raise MismatchInputError(
                f"{module} ran {len(t_calls)} time(s) in the trainer and {len(e_calls)} in the engine at step "
                f"{step}: the engine prefills one sequence per forward, so the trainer must too; set "
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 and "
                "actor_rollout_ref.actor.use_dynamic_bsz=False"
            )
        error, shape = _relative_error(module, t_calls, e_calls, trainer, engine)
        profile.modules.append(LayerError(module, len(t_calls), error, shape))
    if not profile.modules:
        raise MismatchInputError(
            f"the dumps {trainer} and {engine} share no module: dump both at level L0 or mix (config_path: tensor_L0)"
        )
    _mark_layers(profile.modules)
    return profile


def _dump(run: Path, step: int, rank: int, stage: str) -> Path:
    places = [stage_dir(run, step, stage)]
    if stage == TRAINER_STAGE:  # the replay of the step that raised the anomaly comes first
        places.insert(0, stage_dir(run, step, replay_dir_name(stage)))
    for place in places:
        dump = layout.dump_file(layout.session_dir(place, 0, rank))
        if dump.is_file():
            return dump
    how = (
        f"select {TRAINER_STAGE} at step {step} in an msprobe observer with config_path: tensor_L0"
        if stage == TRAINER_STAGE
        else f"give the mismatch observer prefill_steps: [{step}] and select {ENGINE_STAGE} at that step in the "
        "msprobe observer (the rollout engine's process writes it)"
    )
    raise MismatchInputError(f"no {stage} dump for step {step}, rank {rank} under {run}: {how}")


def _outputs(dump: Path) -> dict[str, list[Path]]:
    """Each module's first output tensor file, per call, in the dump's order."""
    try:
        entries = layout.read_dump(dump)
    except (OSError, ValueError) as exc:
        raise MismatchInputError(f"{dump} cannot be read: {exc}") from None
    found: dict[str, dict[int, Path]] = {}
    saw_module = False
    for name, entry in entries.items():
        match = _FORWARD.match(name)
        if not match or not isinstance(entry, dict):
            continue
        saw_module = True
        output = entry.get("output")
        first = output[0] if isinstance(output, list) and output else output
        if isinstance(first, list) and first:  # a tuple output: its first tensor
            first = first[0]
        data_name = first.get("data_name") if isinstance(first, dict) else None
        if isinstance(data_name, str):
            path = _WRAPPERS.sub("", match["path"]).lstrip(".")
            found.setdefault(path, {})[int(match["call"])] = layout.tensor_file(dump, data_name)
    if not saw_module:
        raise MismatchInputError(f"{dump} has no module entries: dump at level L0 or mix (config_path: tensor_L0)")
    if not found:
        raise MismatchInputError(
            f"{dump} holds statistics, not tensors: the layer profile needs the outputs themselves; "
            "dump with task tensor (config_path: tensor_L0)"
        )
    return {module: [calls[k] for k in sorted(calls)] for module, calls in found.items()}


def _relative_error(
    module: str, trainer: list[Path], engine: list[Path], t_dump: Path, e_dump: Path
) -> tuple[float, tuple[int, ...]]:
    """The module's relative error over its calls, and its output's shape at the first."""
    import torch

    difference = reference = 0.0
    shape: tuple[int, ...] = ()
    for call, (t_file, e_file) in enumerate(zip(trainer, engine, strict=True)):
        t, e = _load(t_file), _load(e_file)
        if t.shape != e.shape:
            raise MismatchInputError(
                f"{module}, call {call}: the trainer's output is {list(t.shape)} and the engine's {list(e.shape)} "
                f"({t_dump.parent} against {e_dump.parent}); both sides must run the same sequence in each forward: "
                "set actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 and "
                "actor_rollout_ref.actor.use_dynamic_bsz=False"
            )
        shape = shape or tuple(t.shape)
        t, e = t.double(), e.double()
        difference += float(torch.linalg.vector_norm(e - t)) ** 2
        reference += float(torch.linalg.vector_norm(t)) ** 2
    if reference == 0.0:
        return (0.0 if difference == 0.0 else math.inf), shape
    return math.sqrt(difference / reference), shape


def _load(path: Path) -> Any:
    import torch

    try:
        tensor = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise MismatchInputError(f"{path} is missing: the dump's tensors were not all written") from None
    except Exception as exc:
        raise MismatchInputError(f"{path} cannot be read as a tensor: {type(exc).__name__}: {exc}") from None
    if not isinstance(tensor, torch.Tensor):
        raise MismatchInputError(f"{path} holds a {type(tensor).__name__}, not a tensor")
    return tensor


def _mark_layers(modules: list[LayerError]) -> None:
    names = [m.module for m in modules]
    previous: LayerError | None = None
    for module in modules:
        module.layer = not any(module.module.startswith(other + ".") for other in names if other != module.module)
        if not module.layer:
            continue
        # Growth is along the residual stream: from the last layer whose output has the same
        # last dimension (rotary embeddings, a side branch, are passed over).
        if previous is not None and previous.shape[-1:] != module.shape[-1:]:
            continue
        if previous is not None and 0 < previous.error < math.inf and math.isfinite(module.error):
            module.growth = module.error / previous.error
        previous = module
