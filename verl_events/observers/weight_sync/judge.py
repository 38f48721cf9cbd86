"""One sync judged: what changed since the previous one, what the engine holds, the alarms.

The inputs are fingerprints, not tensors (:mod:`.fingerprint` makes them):
a *manifest* of what the trainer sent, a *receipt* of what the engine holds
after loading it, and the same two from this rank's previous sync.
Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .record import ALARM_KINDS, NAMES_KEPT, Alarm

__all__ = ["Entry", "Judgement", "Receipt", "canary_alarm", "judge", "layer_of", "left_out", "payload_kind"]

#: Adapter tensors, as peft names them (``...q_proj.lora_A.weight``).
_ADAPTER = "lora_"
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)(?:\.|$)")


@dataclass(frozen=True, slots=True)
class Entry:
    """One sent tensor, as the manifest keeps it."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    fingerprint: str
    nonfinite: int


#: What the engine holds after a sync: name -> (dtype, fingerprint).
Receipt = dict[str, tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Judgement:
    changed: int | None
    unchanged: list[str]
    nonfinite: list[str]
    adapter_tensors: int
    receipt: dict[str, Any] | None
    alarms: list[Alarm]


def payload_kind(names: Iterable[str]) -> str:
    """``adapter`` for a payload of LoRA adapter tensors, else ``weights``.  verl's first LoRA
    sync sends the base weights, then the adapter; later ones the adapter alone (the base is
    frozen): a sync's payloads are compared with the previous sync's of the same kind."""
    return "adapter" if any(_ADAPTER in name for name in names) else "weights"


def left_out(previous: dict[str, frozenset[str]], sent: dict[str, frozenset[str]]) -> list[str]:
    """The tensors of the previous sync's payloads (by :func:`payload_kind`) that this sync's
    payloads of the same kind lack; a kind this sync did not send is not judged."""
    return sorted(name for kind, names in sent.items() for name in previous.get(kind, frozenset()) - names)


def layer_of(name: str) -> str:
    """``layer 3`` for ``model.layers.3.mlp.up_proj.weight``; else the tensor's module."""
    found = _LAYER.search(name)
    if found:
        return f"layer {found.group(1)}"
    return name.rsplit(".", 1)[0] if "." in name else name


def judge(
    manifest: dict[str, Entry],
    previous: dict[str, Entry] | None,
    receipt: Receipt | None,
    previous_receipt: Receipt | None,
    *,
    optimizer_stepped: bool | None,
    adapter: bool,
    missing: list[str] | None = None,
) -> Judgement:
    """Compare a sync with the previous one and with the engine's receipt (see :data:`.record.ALARM_KINDS`).

    ``missing``: the tensors the previous sync sent in a payload of a kind this one sent too,
    but this one left out (:func:`left_out`)."""
    nonfinite = [name for name, entry in manifest.items() if entry.nonfinite]
    adapter_tensors = sum(1 for name in manifest if _ADAPTER in name)
    alarms = _payload_alarms(manifest, missing or [], nonfinite, adapter and not adapter_tensors)
    changed: set[str] | None = None
    unchanged: list[str] = []
    if previous is not None:
        changed = {name for name, entry in manifest.items() if _differ(entry, previous.get(name))}
        unchanged = [name for name in manifest if name not in changed]
        if manifest and not changed and optimizer_stepped:
            alarms.append(
                _alarm(
                    "stale_payload",
                    unchanged,
                    f"none of the {len(manifest)} tensors changed since the previous sync, although "
                    "actor_update ran in between: the engine got the weights it already had "
                    "(expected only if verl skipped the optimizer step, for a grad_norm that was not finite)",
                    whole=True,
                )
            )
    summary = None
    if receipt is not None:
        summary, receipt_alarms = _check_receipt(manifest, changed, receipt, previous_receipt)
        alarms += receipt_alarms
    return Judgement(
        changed=None if changed is None else len(changed),
        unchanged=unchanged[:NAMES_KEPT],
        nonfinite=nonfinite[:NAMES_KEPT],
        adapter_tensors=adapter_tensors,
        receipt=summary,
        alarms=alarms,
    )


def _payload_alarms(
    manifest: dict[str, Entry], missing: list[str], nonfinite: list[str], no_adapter: bool
) -> list[Alarm]:
    """What the payload alone says: tensors left out, values not finite, a LoRA sync without its adapter."""
    alarms: list[Alarm] = []
    if missing:
        alarms.append(
            _alarm(
                "missing",
                missing,
                f"{missing[0]} was sent at the previous sync and not at this one: the engine keeps its old value",
            )
        )
    if nonfinite:
        first = nonfinite[0]
        alarms.append(
            _alarm("nonfinite", nonfinite, f"{manifest[first].nonfinite} of {first}'s values are NaN or infinite")
        )
    if no_adapter:
        alarms.append(
            _alarm(
                "no_adapter",
                [],
                f"the sync carried a LoRA peft_config, but none of its {len(manifest)} tensors "
                f"is an adapter ({_ADAPTER}) tensor: the engine serves the base weights",
            )
        )
    return alarms


def canary_alarm(check: Any) -> Alarm:
    """The alarm of a canary check past a tolerance (a :class:`.canary.CanaryCheck`)."""
    layer = check.first_layer if check.first_layer and check.first_layer.startswith("layer ") else None
    if layer is not None:
        index = int(layer.removeprefix("layer "))
        detail = (
            f"the engine's forward of the canary sequences departs from the trainer's at {layer}: relative error "
            f"{check.layers[index]:.3g}, tolerance {check.layer_tolerances[index]:.3g}; "
        )
    elif check.first_layer:
        detail = f"the engine's canary log-probs depart from the trainer's {check.first_layer}: "
    else:
        detail = "the engine's canary log-probs depart from the trainer's (the engine gives no layer outputs): "
    detail += f"|Δ log p| up to {check.max:.3g} nats (tolerance {check.tolerance:.3g})"
    return Alarm("canary", [], 0, layer, detail)


def _check_receipt(
    manifest: dict[str, Entry], changed: set[str] | None, receipt: Receipt, previous_receipt: Receipt | None
) -> tuple[dict[str, Any], list[Alarm]]:
    """Sent against held.  Where the engine holds another dtype than was sent, bytes cannot
    match: only "did the engine's tensor change when the payload's did" is checked there."""
    missing, differs, not_updated, compared = [], [], [], 0
    same_dtype = True
    for name, entry in manifest.items():
        held = receipt.get(name)
        if held is None:
            missing.append(name)
            continue
        dtype, held_fingerprint = held
        before = previous_receipt.get(name) if previous_receipt is not None else None
        kept = changed is not None and name in changed and before is not None and before[1] == held_fingerprint
        if kept:
            not_updated.append(name)
        elif dtype == entry.dtype:
            compared += 1
            if held_fingerprint != entry.fingerprint:
                differs.append(name)
        else:
            same_dtype = False
    alarms = []
    if missing:
        alarms.append(_alarm("not_applied", missing, f"the engine holds no tensor named {missing[0]}"))
    if not_updated:
        alarms.append(
            _alarm(
                "not_updated",
                not_updated,
                f"{not_updated[0]} changed in the payload but the engine still holds its previous value",
            )
        )
    if differs:
        alarms.append(_alarm("differs", differs, f"the engine's {differs[0]} is not what was sent"))
    summary = {
        "tensors": len(receipt),
        "compared": compared,
        "same_dtype": same_dtype,
        "missing": missing[:NAMES_KEPT],
        "differs": differs[:NAMES_KEPT],
        "not_updated": not_updated[:NAMES_KEPT],
    }
    return summary, alarms


def _differ(entry: Entry, before: Entry | None) -> bool:
    return before is None or (entry.fingerprint, entry.dtype, entry.shape) != (
        before.fingerprint,
        before.dtype,
        before.shape,
    )


def _alarm(kind: str, tensors: list[str], detail: str, *, whole: bool = False) -> Alarm:
    """An alarm about ``tensors``, in the layer of the first; ``whole``: about the whole
    payload, which no one layer stands for."""
    assert kind in ALARM_KINDS
    count = len(tensors)
    if count > 1 and not whole:
        detail += f" ({count} tensors{_in_layers(tensors)})"
    layer = layer_of(tensors[0]) if tensors and not whole else None
    return Alarm(kind, tensors[:NAMES_KEPT], count, layer, detail)


def _in_layers(tensors: list[str]) -> str:
    layers = sorted({layer_of(name) for name in tensors}, key=_layer_order)
    if len(layers) > 4:
        return f" in {len(layers)} layers or modules"
    return " in " + ", ".join(layers)


def _layer_order(layer: str) -> tuple[int, int | str]:
    number = layer.removeprefix("layer ")
    return (0, int(number)) if number.isdigit() else (1, layer)
