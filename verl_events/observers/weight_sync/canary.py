"""The canary: a few fixed sequences through the trainer's model and the engine's, compared.

After a sync, both sides run the same token ids, teacher-forced, one forward
each (:func:`forward`): the log-probability of every next token, and each
decoder layer's output.  :func:`compare` measures how far the engine's
log-probs are from the trainer's (``|Δ log p|``) and each layer's relative
error, ``||e - t|| / ||t||`` over the layer's outputs, as ``verl-events
mismatch --layers`` does.  It needs no tensor names, so it still works when
the engine fuses or blocks its weights and the sent names cannot be mapped
onto its own.

The tolerances come from the healthy spread: a rank's first checked sync is
its baseline (two healthy sides differ by their dtypes and kernels: verl's
FSDP actor computes in bfloat16 by default, a float32 engine does not), and
a later sync is past them when its largest ``|Δ log p|`` exceeds
``max(floor, FACTOR x the baseline's)`` or a layer's error exceeds
``max(LAYER_FLOOR, LAYER_FACTOR x its baseline error)``.  A layer's error,
taken over every position of every sequence, moves by a few percent from
one healthy sync to the next (measured on verl's CPU trainer), the largest
``|Δ log p|``, one token's, by some 20 %: hence the two factors.  The first
layer past its tolerance is where the difference enters, the layer the
alarm names.

The sequences are random token ids from a fixed seed (the same on every
rank and in every run), :data:`SEQUENCES` x :data:`TOKENS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FACTOR", "LAYER_FACTOR", "LAYER_FLOOR", "CanaryCheck", "Side", "canary_ids", "compare", "forward"]

SEQUENCES = 2
TOKENS = 32
SEED = 20_251_202
#: How far past the baseline's largest |Δ log p| a healthy sync may go: one token's rounding.
FACTOR = 4.0
#: How far past its baseline error a healthy layer may go: an error over every position moves little.
LAYER_FACTOR = 2.0
#: A layer's relative error that is a difference, not rounding, whatever the baseline:
#: 1e-3, as verl-events mismatch --layers (float32 through a few layers rounds to about 1e-6).
LAYER_FLOOR = 1e-3


@dataclass(frozen=True, slots=True)
class Side:
    """One side's forward: ``log_probs`` [sequences, tokens - 1]; one output per decoder layer
    (none from an engine that gives log-probs only: the check then names no layer)."""

    log_probs: torch.Tensor
    layers: list[torch.Tensor]


@dataclass(slots=True)
class CanaryCheck:
    """One sync's canary on one rank, as the ledger keeps it (tolerances None: the baseline)."""

    max: float
    mean: float
    layers: list[float]
    tolerance: float | None = None
    layer_tolerances: list[float] | None = None
    first_layer: str | None = None  # where the difference enters, when past a tolerance
    past: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "max": _finite(self.max),
            "mean": _finite(self.mean),
            "layers": [_finite(e) for e in self.layers],
            "tolerance": self.tolerance,
            "layer_tolerances": self.layer_tolerances,
            "first_layer": self.first_layer,
        }


def canary_ids(vocab_size: int) -> list[list[int]]:
    """The canary's token ids: fixed, the same on every rank and in every run."""
    generator = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab_size, (SEQUENCES, TOKENS), generator=generator).tolist()


def vocab_size(model: Any) -> int:
    """The model's vocabulary: its HF config's, else its output embedding's rows."""
    module = model[0] if isinstance(model, (list, tuple)) else model
    size = getattr(getattr(module, "config", None), "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    embeddings = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    if embeddings is None:
        raise ValueError(f"{type(module).__name__} has no config.vocab_size and no output embeddings")
    return int(embeddings.weight.shape[0])


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The model's decoder layers: its ``layers`` list (HF's ``model.layers``), else its longest ModuleList."""
    module = model[0] if isinstance(model, (list, tuple)) else model
    lists = [(name, m) for name, m in module.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(f"{type(module).__name__} has no list of layers")
    named = [m for name, m in lists if name.rsplit(".", 1)[-1] == "layers"]
    return named[0] if named else max((m for _, m in lists), key=len)


def forward(model: Any, ids: list[list[int]]) -> Side:
    """``ids`` through ``model`` (a HF causal LM, FSDP-wrapped or not), teacher-forced, no grad:
    each next token's log-prob (raw logits, no temperature) and every decoder layer's output.
    Under FSDP every rank must call it at once: the forward gathers each layer's weights."""
    module = model[0] if isinstance(model, (list, tuple)) else model
    device = next(module.parameters()).device
    inputs = torch.tensor(ids, dtype=torch.long, device=device)
    outputs: list[torch.Tensor] = []

    def keep(_module: Any, _args: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, (tuple, list)) else output
        outputs.append(hidden.detach().to("cpu", torch.float32))  # float32: half the bytes over Ray

    hooks = [layer.register_forward_hook(keep) for layer in decoder_layers(module)]
    try:
        with torch.no_grad():
            logits = module(input_ids=inputs, use_cache=False).logits
    finally:
        for hook in hooks:
            hook.remove()
    log_probs = torch.log_softmax(logits[:, :-1].to(torch.float64), dim=-1)
    picked = log_probs.gather(-1, inputs[:, 1:, None]).squeeze(-1).cpu()
    return Side(picked, outputs)


def compare(trainer: Side, engine: Side, baseline: CanaryCheck | None, floor: float) -> CanaryCheck:
    """The engine's side against the trainer's; ``baseline`` None makes this check the baseline."""
    layered = bool(engine.layers)  # an inference server gives log-probs only
    if trainer.log_probs.shape != engine.log_probs.shape or (layered and len(trainer.layers) != len(engine.layers)):
        raise ValueError(
            f"the two sides differ in shape: log-probs {list(trainer.log_probs.shape)} and "
            f"{list(engine.log_probs.shape)}, {len(trainer.layers)} and {len(engine.layers)} layers"
        )
    gap = (engine.log_probs.double() - trainer.log_probs.double()).abs()
    errors = [_relative_error(t, e) for t, e in zip(trainer.layers, engine.layers, strict=True)] if layered else []
    check = CanaryCheck(max=_max(gap), mean=float(gap.mean()), layers=errors)
    if baseline is None:
        return check
    check.tolerance = max(floor, FACTOR * baseline.max)
    check.layer_tolerances = [max(LAYER_FLOOR, LAYER_FACTOR * before) for before in baseline.layers]
    past = [
        index for index, (e, limit) in enumerate(zip(errors, check.layer_tolerances, strict=True)) if not e <= limit
    ]
    check.past = bool(past) or not check.max <= check.tolerance  # NaN is past
    if past:
        check.first_layer = f"layer {past[0]}"
    elif check.past and layered:
        check.first_layer = "after the last layer"  # every layer within its own: the head
    return check


def _relative_error(trainer: torch.Tensor, engine: torch.Tensor) -> float:
    trainer, engine = trainer.double(), engine.double()
    reference = float(torch.linalg.vector_norm(trainer))
    difference = float(torch.linalg.vector_norm(engine - trainer))
    if reference == 0.0:
        return 0.0 if difference == 0.0 else math.inf
    return difference / reference


def _max(values: torch.Tensor) -> float:
    if bool(torch.isnan(values).any()):
        return math.nan
    return float(values.max())


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
