"""A save judged against the rank's previous one, a load against the save's manifest, and
the trainer loop's end against what it was asked for.  Standard library only.

* **save** (:func:`judge_save`): ``nonfinite``, each part holding NaN or infinite values;
  ``unchanged``, the model's or the optimizer's tensors all identical to the rank's
  previous save of the same folder kind (``actor``, ``critic``) although ``updates`` > 0
  (an optimizer step ended in between).  Without an update in between, equal is right.
* **load** (:func:`judge_load`): ``not_restored``, the model or optimizer as the rank holds
  it once loaded differs from the manifest (a tensor missing, another
  dtype, shape or fingerprint), or no ``load_state_dict`` took it at all; a file read
  whose tensors differ from what was saved (changed on disk since), or a saved part no
  file was read for.
* **the loop** (:func:`judge_loop`): ``no_progress``, a loop that returned normally having
  trained no step, or fewer than it was asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from verl_events import LoopEnded

from .record import NAMES_KEPT, VALUES, Alarm, TensorEntry

__all__ = ["judge_load", "judge_loop", "judge_save", "nonfinite_names", "tensor_count"]

#: The parts whose state a load hands to ``load_state_dict``, where the taps see it held.
HELD_PARTS = ("model", "optimizer")
#: The parts an optimizer step changes.
STEPPED_PARTS = ("model", "optimizer")

Tensors = Mapping[str, TensorEntry]


def _alarm(kind: str, part: str | None, names: list[str], detail: str) -> Alarm:
    """An alarm naming ``names`` in the state's own order, the other values last; its count
    is of tensors (the other values are one entry, not a tensor)."""
    tensors = [name for name in names if name != VALUES]
    return Alarm(kind, part, (tensors + [VALUES] * (VALUES in names))[:NAMES_KEPT], len(tensors), detail)


def nonfinite_names(tensors: Tensors) -> list[str]:
    return [name for name, entry in tensors.items() if entry[4]]


def judge_save(
    parts: Mapping[str, Tensors], previous: Mapping[str, Tensors] | None, updates: int | None, previous_step: int | None
) -> list[Alarm]:
    """The alarms of one rank's save (see the module docstring)."""
    alarms = []
    for part, tensors in parts.items():
        bad = nonfinite_names(tensors)
        if bad:
            values = sum(tensors[name][4] for name in bad)
            alarms.append(_alarm("nonfinite", part, bad, f"{len(bad)} {part} tensor(s) hold {values} NaN/inf value(s)"))
    if previous is None or not updates:
        return alarms
    for part in STEPPED_PARTS:
        now, before = parts.get(part), previous.get(part)
        if not now or not before:
            continue
        prints = {name: entry[3] for name, entry in now.items() if name != VALUES}
        if prints and prints == {name: entry[3] for name, entry in before.items() if name != VALUES}:
            alarms.append(
                _alarm(
                    "unchanged",
                    part,
                    list(prints),
                    f"all {len(prints)} {part} tensor(s) are identical to the save of step {previous_step}, "
                    f"although {updates} optimizer update(s) ran in between: this checkpoint's {part} is stale",
                )
            )
    return alarms


def judge_load(
    saved: Mapping[str, Tensors],
    held: Mapping[str, Tensors],
    read: Mapping[str, Tensors],
    saved_step: int | None,
    unknown: Collection[str] = (),
) -> tuple[list[Alarm], int]:
    """The alarms of one rank's load, and how many tensors were compared.

    ``saved``: the manifest's tensors by part; ``held``: what the rank holds after it was
    loaded, by part; ``read``: what its ``torch.load`` calls returned, by part; ``unknown``:
    the parts loaded whose state could not be described (not compared: no alarm either).
    """
    alarms, compared = [], 0
    of = f"the save of step {saved_step}" if saved_step is not None else "the save"
    for part, tensors in saved.items():
        if part in HELD_PARTS and part in unknown:
            continue
        if part in HELD_PARTS:
            after = held.get(part)
            if after is None:
                alarms.append(
                    _alarm(
                        "not_restored",
                        part,
                        list(tensors),
                        f"the {part} was never loaded: no load_state_dict took it, so the rank trains on with its "
                        f"own {part} state, not the {_tensors(tensors)} of {of}",
                    )
                )
                continue
            compared += tensor_count(tensors)
            alarms += _differences(part, tensors, after, f"the {part} the rank holds after the load", of)
        elif part in read:
            compared += tensor_count(tensors)
            alarms += _differences(part, tensors, read[part], f"the {part} file read", of)
        else:
            alarms.append(
                _alarm(
                    "not_restored",
                    part,
                    list(tensors),
                    f"the {part} file of {of} was not read: its {_tensors(tensors)} were not restored",
                )
            )
    for part, tensors in read.items():
        if part in HELD_PARTS and part in saved:
            alarms += _differences(part, saved[part], tensors, f"the {part} file as it is on disk now", of)
    return alarms, compared


def tensor_count(tensors: Tensors) -> int:
    """How many tensors: the other values are one entry, not a tensor."""
    return sum(1 for name in tensors if name != VALUES)


def _tensors(tensors: Tensors) -> str:
    """``"81 tensor(s) and other values"``: how much of a state an alarm is about."""
    return f"{tensor_count(tensors)} tensor(s)" + (" and other values" if VALUES in tensors else "")


def _differences(part: str, saved: Tensors, found: Tensors, what: str, of: str) -> list[Alarm]:
    missing = [name for name in saved if name not in found]
    differs = [name for name, entry in saved.items() if name in found and found[name] != entry]
    alarms = []
    if missing:
        missed = _tensors({name: saved[name] for name in missing})
        alarms.append(_alarm("not_restored", part, missing, f"{missed} of the {part} of {of} are not in {what}"))
    if differs:
        changed = _tensors({name: saved[name] for name in differs})
        alarms.append(
            _alarm(
                "not_restored",
                part,
                differs,
                f"{changed} of the {part}'s {tensor_count(saved)} in {what} differ from {of} "
                "(fingerprint, dtype or shape)",
            )
        )
    return alarms


def judge_loop(ended: LoopEnded) -> list[Alarm]:
    """``no_progress`` for a loop that trained none, or fewer steps than asked."""
    since = f"resumed from step {ended.resumed_from}" if ended.resumed_from else "started fresh"
    asked = ended.asked
    if ended.trained == 0:
        wanted = f", asked for {asked} more (total_training_steps={ended.total_steps})" if asked is not None else ""
        return [
            _alarm(
                "no_progress",
                None,
                [],
                f"the trainer's loop {since}{wanted} and returned normally having trained no step",
            )
        ]
    if asked is not None and ended.trained < asked:
        return [
            _alarm(
                "no_progress",
                None,
                [],
                f"the trainer's loop {since} and returned normally after {ended.trained} step(s) of the {asked} it "
                f"was asked for (total_training_steps={ended.total_steps}, last step {ended.last_step}), "
                "with no failure to explain it",
            )
        ]
    return []
