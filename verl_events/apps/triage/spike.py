"""Triage of a ``spike`` (and ``above``/``below``): what moved between two dumps.

The dumps are the last healthy dump of a stage (a step before the anomaly)
and the first dump of that stage after it.  Parameters first: when one
module parameter moved far more than the others (:func:`jumped_parameter`:
x2 or more, and ten times the others' median move), the op named is the
first, in execution order, to read it.  Otherwise the op whose output moved
most (:func:`output_moves`): a move is the factor by which a tensor's RMS
changed, either way (x1000 and /1000 move as much), with a near-zero tensor
measured against the scale of what it was computed from, so a KL of 0.0002
going to 0.2 does not outweigh the layer where the jump entered; ops
downstream inherit a jump, so the op named is the earliest whose move is of
the order of the largest (:func:`same_order`), where the jump entered.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from .dumps import MODULE_ENTRY, Session, describe_part, same_tensor, tensor_identity, tensors
from .finding import Finding, place

__all__ = [
    "NEAR_ZERO",
    "PARAMETER_JUMP",
    "PARAMETER_OUTLIER",
    "ParameterMove",
    "first_reader",
    "jumped_parameter",
    "most_moved",
    "output_moves",
    "output_scales",
    "parameter_moves",
    "same_order",
]

NEAR_ZERO = 0.1  # a tensor below a tenth of its scale is measured against that tenth
PARAMETER_JUMP = 2.0  # a parameter that moved at least x2 ...
PARAMETER_OUTLIER = 10.0  # ... whose move is ten times the others' median move or more (see jumped_parameter)


def _rms(stats: dict[str, Any]) -> float | None:
    """A tensor's root mean square, its norm over the square root of its size
    (so that a scalar and a large tensor compare); None without a norm."""
    norm, shape = stats.get("Norm"), stats.get("shape")
    if not isinstance(norm, (int, float)):
        return None
    size = math.prod(shape) if isinstance(shape, list) and all(isinstance(n, int) for n in shape) else 1
    return abs(norm) / math.sqrt(size) if size > 0 else None


def _max_abs(stats: dict[str, Any]) -> float | None:
    values = [abs(v) for key in ("Max", "Min") if isinstance(v := stats.get(key), (int, float))]
    return None if not values else math.nan if any(map(math.isnan, values)) else max(values)


def _factor(new: float, old: float, floor: float = 0.0) -> float:
    """How many times larger (or smaller) ``new`` is than ``old``, >= 1, each
    taken as at least ``floor``; a change to or from NaN/Inf is infinite."""
    if not (math.isfinite(new) and math.isfinite(old)):
        return 1.0 if repr(new) == repr(old) else math.inf
    a, b = max(new, floor), max(old, floor)
    if a == b:
        return 1.0
    return math.inf if min(a, b) == 0 else max(a, b) / min(a, b)


def _median(values: list[float | None]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else 0.0


def output_scales(session: Session) -> dict[tuple[str, str], float]:
    """The scale of each output (entry, label) of ``session``: the larger of
    its RMS and the scales of the op's inputs, in execution order (an input
    is known by its statistics as an earlier output; else its own RMS
    counts).  A difference of two nearly equal log-probs is small, and the
    mean of that difference smaller still; both have the log-probs' scale."""
    known: dict[str, float] = {}
    scales: dict[tuple[str, str], float] = {}
    for entry, value in session.entries.items():
        parts = [
            (label, stats, rms)
            for label, stats in tensors(value)
            if (rms := _rms(stats)) is not None and math.isfinite(rms)
        ]
        source = max(
            (known.get(tensor_identity(stats), rms) for label, stats, rms in parts if not _is_output(entry, label)),
            default=0.0,
        )
        for label, stats, rms in parts:
            if _is_output(entry, label):
                scale = scales[entry, label] = max(rms, source)
                known[tensor_identity(stats)] = max(known.get(tensor_identity(stats), 0.0), scale)
    return scales


def output_moves(armed: Session, healthy: Session) -> list[tuple[str, float, list[str]]]:
    """Each entry of ``armed`` also in ``healthy``, in execution order, with
    how much its outputs (forward outputs, backward gradients, parameter
    gradients) moved, and which moved most: the factor by which an output's
    RMS changed, either way, each RMS taken as at least ``NEAR_ZERO`` (a
    tenth) of the output's scale in ``healthy`` (:func:`output_scales`).

    Why the floor: a bare ratio makes a quantity near zero the op that
    moved most.  The demo's KL between the actor and its reference,
    ``(log_prob - ref_log_prob).mean()``, is 0.0002 and moves x918 to 0.19
    after a spike that entered where a layer's output moved x50; measured
    against a tenth of the log-probs it is computed from, it moves x1.  An
    output at least a tenth of its inputs' scale (most layers) keeps its
    own ratio: the floor only lifts cancellations (differences, means of
    signed values) and what is computed from them."""
    scales = output_scales(healthy)
    moves = []
    for entry, value in armed.entries.items():
        before = healthy.entries.get(entry)
        if before is None:
            continue
        old = dict(tensors(before))
        factors = {
            label: _factor(new, then, NEAR_ZERO * scales.get((entry, label), 0.0))
            for label, stats in tensors(value)
            if _is_output(entry, label)
            and label in old
            and (new := _rms(stats)) is not None
            and (then := _rms(old[label])) is not None
        }
        if factors:
            top = max(factors.values())
            moves.append((entry, top, [label for label, f in factors.items() if f == top]))
    return moves


@dataclass(frozen=True, slots=True)
class ParameterMove:
    """A module parameter in both dumps and how much it moved (:func:`parameter_moves`)."""

    module: str  # the module's path, "up"
    module_entry: str  # the module's first forward entry, which lists it
    name: str  # as the module calls it, "weight"
    stats: dict[str, Any]  # in the dump after the anomaly
    factor: float


def parameter_moves(armed: Session, healthy: Session) -> dict[str, ParameterMove]:
    """Each module parameter recorded in both dumps (a module's forward entry
    lists them at levels L0 and mix), by full name ("up.weight"), with how
    much it moved: the larger of the factors by which its RMS and its
    largest absolute value changed (one corrupted element moves the latter),
    each taken as at least ``NEAR_ZERO`` of the healthy parameters' median
    (a LayerNorm bias that started at zero moves x3 in a few steps; it is
    near zero, not jumping)."""
    pairs: dict[str, tuple[str, str, str, dict[str, Any], dict[str, Any]]] = {}
    for entry, value in armed.entries.items():
        match = MODULE_ENTRY.match(entry)
        if match is None or match["dir"] != "forward":
            continue
        then = _parameters(healthy.entries.get(entry))
        for name, stats in _parameters(value).items():
            if name in then:
                pairs.setdefault(f"{match['path']}.{name}", (match["path"], entry, name, stats, then[name]))
    measures = (_rms, _max_abs)
    floors = [NEAR_ZERO * _median([measure(old) for *_, old in pairs.values()]) for measure in measures]
    moves = {}
    for full, (module, entry, name, new, old) in pairs.items():
        factors = [
            _factor(a, b, floor)
            for measure, floor in zip(measures, floors, strict=True)
            if (a := measure(new)) is not None and (b := measure(old)) is not None
        ]
        if factors:
            moves[full] = ParameterMove(module, entry, name, new, max(factors))
    return moves


def _parameters(entry: Any) -> dict[str, dict[str, Any]]:
    return dict(tensors(entry.get("parameters"))) if isinstance(entry, dict) else {}


def jumped_parameter(moves: dict[str, ParameterMove]) -> tuple[str, float] | None:
    """The parameter that moved most, with the median move of the others, when
    it stands out: it moved ``PARAMETER_JUMP`` (x2) or more, and its move
    (factor - 1) is ``PARAMETER_OUTLIER`` (ten) times the others' median's
    or more.  Between two healthy steps an optimizer moves a parameter by a
    small fraction of itself (the demo's median: x1.002 from step 2 to 6), so a x2
    that stands out tenfold was put there, not learnt.  None when no
    parameter stands out (nothing jumped, or everything moved alike: a
    learning rate blow-up has no one parameter to name)."""
    if not moves:
        return None
    name = max(moves, key=lambda n: moves[n].factor)
    factor, rest = moves[name].factor, [m.factor for n, m in moves.items() if n != name]
    others = statistics.median(rest) if rest else 1.0
    return (name, others) if factor >= PARAMETER_JUMP and factor - 1 >= PARAMETER_OUTLIER * (others - 1) else None


def first_reader(session: Session, move: ParameterMove) -> tuple[str, str]:
    """The first entry, in execution order, that reads the parameter, and the
    part of it that is the parameter: an API call handed a tensor with the
    parameter's dtype, shape and statistics (level mix; its module's entry
    comes after the calls the module made), else the module's forward entry."""
    for entry, value in session.entries.items():
        if entry == move.module_entry:
            break
        if entry.endswith(".forward") and not entry.startswith("Module."):
            for label, stats in tensors(value):
                if label.startswith("input") and same_tensor(stats, move.stats):
                    return entry, label
    return move.module_entry, f"parameters.{move.name}"


def most_moved(armed: Session, healthy: Session) -> Finding | None:
    """What moved from ``healthy`` to ``armed``: the first op to read the
    parameter that jumped (:func:`jumped_parameter`), else the op whose
    outputs moved most (:func:`output_moves`), the earliest whose move is of
    the order of the largest (see :func:`same_order`), with the parameter of
    its module that moved most.  None when the two share no entry."""
    moves, params = output_moves(armed, healthy), parameter_moves(armed, healthy)
    if (jump := jumped_parameter(params)) is not None:
        name, others = jump
        entry, label = first_reader(armed, params[name])
        part = label if label.startswith("parameters.") else f"{label} = {name}"
        finding = Finding(entry, [part], parameter=name, parameter_factor=params[name].factor, others=others)
        finding.factor = next((factor for op, factor, _ in moves if op == entry), None)
        place(finding, armed)
        return finding
    if not moves:
        return None
    largest = max(moves, key=lambda m: m[1])
    entry, factor, labels = next(m for m in moves if same_order(m[1], largest[1]))
    finding = Finding(entry, [describe_part(entry, label) for label in labels], factor=factor)
    if entry != largest[0]:
        finding.largest = (largest[0], largest[1])
    place(finding, armed)
    own = [move for move in params.values() if move.module == finding.module]
    if own and (top := max(own, key=lambda m: m.factor)).factor > 1.0:
        finding.parameter, finding.parameter_factor = f"{top.module}.{top.name}", top.factor
    return finding


def same_order(factor: float, largest: float) -> bool:
    """Whether a move of ``factor`` counts as large as ``largest``: at least
    a tenth of it and at least half its orders of magnitude (its square
    root).  Ops downstream inherit a jump and backward ops see it twice
    (through activations and weights), so the largest move is often past
    the op where the jump entered; the earliest of the same order is it."""
    return factor == largest or factor >= max(largest / 10, math.sqrt(largest))


def _is_output(entry: str, label: str) -> bool:
    return ".parameters_grad." in entry or label.split(".")[0] == "output"
