"""Triage of a ``non_finite`` anomaly: the first op with a NaN or Inf.

The op named is the first, in execution order, with a NaN or Inf in any
statistic (Max, Min, Mean, Norm) of any tensor it saw (the parts that have
one are named: output, inputs, parameters, gradients), with the parameter
it read when the dump holds parameters.

Ops that torch.distributed runs itself are passed over (FSDP2's all-gather
copies each rank's shard into the whole weight with ``Tensor.narrow`` before
the forward): they carry a NaN that was already in a weight to the op that
uses it, which is the one to name.  When only such ops hold one, the first
of them is named.
"""

from __future__ import annotations

from typing import Any

from .dumps import Session, describe_part, non_finite, run_by_torch_distributed, same_tensor, tensors
from .finding import Finding, place

__all__ = ["first_non_finite"]


def first_non_finite(session: Session) -> Finding | None:
    """The first entry, in execution order, with a non-finite statistic,
    passing over ops torch.distributed runs (see the module docstring)."""
    mover: tuple[str, Any, list[str]] | None = None
    for entry, value in session.entries.items():
        bad = [label for label, stats in tensors(value) if non_finite(stats)]
        if not bad:
            continue
        if run_by_torch_distributed(session.stacks.get(entry, [])):
            mover = mover or (entry, value, bad)
            continue
        return _finding(session, entry, value, bad)
    return None if mover is None else _finding(session, *mover)


def _finding(session: Session, entry: str, value: Any, bad: list[str]) -> Finding:
    finding = Finding(entry, [describe_part(entry, label) for label in bad])
    place(finding, session)
    _name_parameter(finding, session, dict(tensors(value)), bad)
    return finding


def _name_parameter(finding: Finding, session: Session, own: dict[str, dict[str, Any]], bad: list[str]) -> None:
    """The non-finite parameter the op read: its own (a module's
    ``parameters``, a parameter gradient), or the enclosing module's that is
    one of its non-finite inputs (same dtype, shape and statistics: an API
    is passed the module's weight), else any non-finite one of that module."""
    if finding.module is None or finding.module_entry is None:
        return
    if ".parameters_grad." in finding.op:
        finding.parameter = f"{finding.module}.{bad[0].split('.')[0]}"
        return
    if own_params := [label.split(".")[1] for label in bad if label.startswith("parameters.")]:
        finding.parameter = f"{finding.module}.{own_params[0]}"
        return
    params = [
        (name, stats)
        for name, stats in tensors(session.entries.get(finding.module_entry, {}).get("parameters", {}))
        if non_finite(stats)
    ]
    for name, stats in params:
        for i, label in enumerate(bad):
            if same_tensor(stats, own[label]):
                finding.parameter = f"{finding.module}.{name}"
                finding.parts[i] += f" = {finding.parameter}"
                return
    if params:
        finding.parameter = f"{finding.module}.{params[0][0]}"
