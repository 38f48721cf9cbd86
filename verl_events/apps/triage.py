"""``verl-events triage RUN``: from a recorded anomaly to the op behind it.

Reads ``{RUN}/anomalies.jsonl`` (one record per anomaly a watcher saw:
step, stage, rank, metric, value, rule, baseline, detail, run, time) and
the msprobe dumps of the run, and names, for the first anomaly (lowest
step, then earliest time):

* ``non_finite``: the first op, in execution order, with a NaN or Inf in
  any statistic (Max, Min, Mean, Norm) of any tensor it saw (the parts that
  have one are named: output, inputs, parameters, gradients), in the first
  dump after the anomaly's step that holds one; that rank's dumps are
  scanned by step, then verl's stage order (another rank's, with a note,
  when that rank has none after the step);
* ``spike`` (and ``above``/``below``): what moved between the last healthy
  dump of a stage (a step before the anomaly) and the first dump of that
  stage after it (the anomaly's own stage is tried first).  Parameters
  first: when one module parameter moved far more than the others
  (:func:`jumped_parameter`: x2 or more, and ten times the others' median
  move), the op named is the first, in execution order, to read it.
  Otherwise the op whose output moved most (:func:`output_moves`): a move
  is the factor by which a tensor's RMS changed, either way (x1000 and
  /1000 move as much), with a near-zero tensor measured against the scale
  of what it was computed from, so a KL of 0.0002 going to 0.2 does not
  outweigh the layer where the jump entered; ops downstream inherit a jump,
  so the op named is the earliest whose move is of the order of the
  largest (:func:`same_order`), where the jump entered.

For the op: its module, the first user frame of its call stack, and the
parameter it read when the dump holds parameters.

What this relies on in msprobe 26.2 dumps (``step*/rank*/``), verified in
its source (``core/dump/data_dump/json_writer.py``) and on real dumps
(tests/test_triage.py):

* **Execution order is dump.json's key order.**  msprobe appends an entry
  when it is recorded; a module entry (``Module.*``), begun at its
  pre-forward hook, is popped and re-inserted when its forward ends, so it
  sits after the APIs it ran: ``Functional.linear.0.forward`` before
  ``Module.fc1.Linear.forward.0``.  Backward entries follow in the order
  autograd ran them.  construct.json maps each entry to its enclosing
  module (null for none, or the root model, which msprobe never hooks; it
  is ``{}`` at level L1) and carries no order of its own.
* Entry names: ``{Prefix}.{api}.{n}.{forward|backward}`` (APIs, levels L1
  and mix), ``Module.{path}.{Class}.{forward|backward|parameters_grad}.{n}``
  (levels L0 and mix).  Forward entries hold ``input_args``,
  ``input_kwargs``, ``output`` and, for modules, ``parameters`` (name ->
  statistics); backward entries ``input`` (the gradients arriving at the
  op's outputs) and ``output`` (the gradients it passes back, in autograd's
  order: bias, input, weight for a linear);
  ``parameters_grad`` entries map a parameter name to its gradient.  A
  tensor is a dict with ``Max``/``Min``/``Mean``/``Norm`` (bare ``NaN`` /
  ``Infinity`` tokens, which Python's json reads).
* stack.json is ``{"0": [[entry names], [frames]]}`` with each frame
  ``"File {path}, line {n}, in {function}, \\n {code}"``, innermost first,
  msprobe's own frames already removed.  msprobe records stacks of forward
  calls only; a backward entry gets the stack of its forward call.

**The user frame** is the first frame, innermost first, whose file is not
in a library that only carries the call: a ``torch``, ``torch_npu`` or
``msprobe`` package directly under ``site-packages``/``dist-packages``, the
Python standard library (``lib/python3.N/`` outside ``site-packages``) or
a pseudo-file (``<frozen ...>``).  Model libraries (transformers, verl)
count as user code: their modeling files are where a layer is written.

Exit codes: 0 nothing recorded, 1 an anomaly (whether or not an op was
found), 2 bad input.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from verl_events import STAGE_ROLES
from verl_events.layout import incomplete_reason, owner_of, session_dirs

from .compare import read_dump

ANOMALY_FILE = "anomalies.jsonl"
RECORD_KEYS = ("step", "stage", "rank", "metric", "value", "rule")
STATS = ("Max", "Min", "Mean", "Norm")
LIBRARY_PACKAGES = frozenset({"torch", "torch_npu", "msprobe"})
NEAR_ZERO = 0.1  # a tensor below a tenth of its scale is measured against that tenth
PARAMETER_JUMP = 2.0  # a parameter that moved at least x2 ...
PARAMETER_OUTLIER = 10.0  # ... whose move is ten times the others' median move or more (see jumped_parameter)

_MODULE = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward|parameters_grad)\.(?P<n>\d+)$")
_API = re.compile(r"^(?P<api>.+\.\d+)\.(?P<dir>forward|backward)$")
_FRAME = re.compile(r"^File (?P<file>.*), line (?P<line>\d+), in (?P<function>.*?), \n ?(?P<code>.*)$", re.DOTALL)
_STAGE_ORDER = {stage: i for i, stage in enumerate(STAGE_ROLES)}


class TriageInputError(ValueError):
    """RUN cannot be triaged (exit 2); the message says why."""


# -- the anomalies -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One line of anomalies.jsonl, as written (``record``) and read back."""

    record: dict[str, Any]
    line: int

    @property
    def step(self) -> int | None:
        step = self.record["step"]
        return step if isinstance(step, int) else None

    @property
    def rule(self) -> str:
        return str(self.record["rule"])

    def describe(self) -> str:
        r = self.record
        text = f"step {r['step']} {r['stage']} rank {r['rank']}: {r['metric']} = {r['value']} ({r['rule']}"
        text += f", baseline {r['baseline']})" if r.get("baseline") is not None else ")"
        return text + (f": {r['detail']}" if r.get("detail") else "")


def read_anomalies(run: Path, skipped: list[str]) -> list[Anomaly]:
    """The anomalies of ``run``, in file order; a line that is not JSON or
    not an anomaly record is skipped with a sentence in ``skipped``.  No
    file is no anomaly; a file that cannot be read raises TriageInputError."""
    path = run / ANOMALY_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise TriageInputError(f"{path} cannot be read: {exc}") from exc
    found = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            skipped.append(f"{path}:{number} is not a JSON line ({exc}) and was skipped")
            continue
        if not (
            isinstance(record, dict) and all(key in record for key in RECORD_KEYS)
            and isinstance(record["rank"], int) and isinstance(record["stage"], str)
            and (record["step"] is None or isinstance(record["step"], int))
        ):
            skipped.append(
                f"{path}:{number} is not an anomaly record (needs {', '.join(RECORD_KEYS)}; step, rank integers) and was skipped"
            )
            continue
        found.append(Anomaly(record, number))
    return found


# -- the dumps ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dump:
    """One msprobe session: ``{run}/step_{step}/{stage}/step{call}/rank{rank}``."""

    path: Path
    step: int
    stage: str
    call: int
    rank: int

    @property
    def order(self) -> tuple[int, int, str, int]:
        return (self.step, _STAGE_ORDER.get(self.stage, len(_STAGE_ORDER)), self.stage, self.call)


def find_dumps(run: Path) -> list[Dump]:
    """Every session of a known step, by step, verl's stage order, call, rank."""
    dumps = []
    for rank_dir in session_dirs(run):
        parts = rank_dir.relative_to(run).parts
        step, call, rank = parts[0].removeprefix("step_"), parts[2].removeprefix("step"), rank_dir.name.removeprefix("rank")
        if step.isdigit() and call.isdigit() and rank.isdigit():
            dumps.append(Dump(rank_dir, int(step), parts[1], int(call), int(rank)))
    return sorted(dumps, key=lambda d: (d.order, d.rank))


@dataclass(slots=True)
class Session:
    """A dump's three files, read: entries in execution order, each entry's
    enclosing module and its call stack (empty where msprobe wrote none)."""

    dump: Dump
    entries: dict[str, Any]
    parents: dict[str, str | None]
    stacks: dict[str, list[str]]


def read_session(dump: Dump, notes: list[str]) -> Session | None:
    """The session, or None (with a note) when its dump.json is missing or unreadable."""
    reason = incomplete_reason(dump.path)
    if reason is not None:
        notes.append(f"{dump.path} is an incomplete msprobe session ({reason}); read as far as it goes")
    try:
        entries = read_dump(dump.path / "dump.json")
    except ValueError as exc:
        notes.append(f"{dump.path} was skipped: {exc}")
        return None
    stacks: dict[str, list[str]] = {}
    for pair in _mapping(dump.path / "stack.json").values():
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], list) and isinstance(pair[1], list):
            stacks.update((name, pair[1]) for name in pair[0])
    return Session(dump, entries, _mapping(dump.path / "construct.json"), stacks)


def _mapping(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; empty when it is missing or not one
    (msprobe writes no stack.json or construct.json with ``extra_info: false``)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


# -- reading an entry -----------------------------------------------------------------


def tensors(value: Any, label: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every tensor's statistics in an entry (or part of one), labelled by
    where it sits: ``output.0``, ``input_args.1``, ``parameters.weight``."""
    if isinstance(value, dict):
        if "Max" in value or "Norm" in value:
            return [(label, value)]
        if "type" in value:
            return []  # a non-tensor argument
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return []
    return [found for key, item in items for found in tensors(item, f"{label}.{key}" if label else str(key))]


def non_finite(stats: dict[str, Any]) -> bool:
    return any(isinstance(v, (int, float)) and not math.isfinite(v) for s in STATS if (v := stats.get(s)) is not None)


def forward_of(entry: str) -> str:
    """The forward call an entry belongs to (msprobe keeps stacks and parameters there)."""
    if match := _MODULE.match(entry):
        return f"Module.{match['path']}.{match['cls']}.forward.{match['n']}"
    if match := _API.match(entry):
        return f"{match['api']}.forward"
    return entry


def describe_part(entry: str, label: str) -> str:
    """A tensor's label in words: gradients say so (msprobe lists a backward
    op's outgoing gradients in autograd's order, not its inputs' order)."""
    if ".parameters_grad." in entry:
        return f"grad of {label.split('.')[0]}"
    return f"{label} (gradient)" if entry.endswith(".backward") or ".backward." in entry else label


def is_library_frame(file: str) -> bool:
    """See the module docstring: torch/torch_npu/msprobe, the stdlib, pseudo-files."""
    if file.startswith("<"):
        return True
    parts = PurePosixPath(file.replace("\\", "/")).parts
    installed = {"site-packages", "dist-packages"}
    if any(part in installed and parts[i + 1] in LIBRARY_PACKAGES for i, part in enumerate(parts[:-1])):
        return True
    stdlib = any(part == "lib" and re.fullmatch(r"python3\.\d+", parts[i + 1]) for i, part in enumerate(parts[:-1]))
    return stdlib and not installed.intersection(parts)


def user_frame(frames: list[str]) -> dict[str, Any] | None:
    """The first frame of ``frames`` (innermost first) outside the libraries, parsed."""
    for frame in frames:
        match = _FRAME.match(frame)
        if match and not is_library_frame(match["file"]):
            return {"file": match["file"], "line": int(match["line"]), "function": match["function"], "code": match["code"].strip()}
    return None


# -- the finding -------------------------------------------------------------------------


@dataclass(slots=True)
class Finding:
    """The op triage names: entry, the parts that show the problem, its
    module, source frame and the parameter it read."""

    op: str
    parts: list[str]
    module: str | None = None  # the module's path, e.g. "fc1"
    module_entry: str | None = None
    parameter: str | None = None  # e.g. "fc1.weight"
    source: dict[str, Any] | None = None
    factor: float | None = None  # spike: how much its outputs moved (>= 1, either way; output_moves)
    parameter_factor: float | None = None  # spike: how much the parameter moved (parameter_moves)
    largest: tuple[str, float] | None = None  # spike: the op that moved most, when not this one
    others: float | None = None  # spike, a parameter that jumped: the median move of the other parameters

    def as_json(self) -> dict[str, Any]:
        return {
            "op": self.op, "parts": self.parts, "module": self.module, "module_entry": self.module_entry,
            "parameter": self.parameter, "source": self.source,
            "factor": _json_number(self.factor), "parameter_factor": _json_number(self.parameter_factor),
            "largest": None if self.largest is None else {"op": self.largest[0], "factor": _json_number(self.largest[1])},
        }


def place(finding: Finding, session: Session) -> None:
    """Fill in the finding's module and source from the session's construct and stack."""
    forward = forward_of(finding.op)
    module_entry = forward if forward.startswith("Module.") else session.parents.get(forward)
    if module_entry and (match := _MODULE.match(module_entry)):
        finding.module, finding.module_entry = match["path"], forward_of(module_entry)
    frames = session.stacks.get(finding.op) or session.stacks.get(forward) or []
    finding.source = user_frame(frames)


def first_non_finite(session: Session) -> Finding | None:
    """The first entry, in execution order, with a non-finite statistic."""
    for entry, value in session.entries.items():
        bad = [label for label, stats in tensors(value) if non_finite(stats)]
        if bad:
            finding = Finding(entry, [describe_part(entry, label) for label in bad])
            place(finding, session)
            _name_parameter(finding, session, dict(tensors(value)), bad)
            return finding
    return None


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
    params = [(name, stats) for name, stats in tensors(session.entries.get(finding.module_entry, {}).get("parameters", {}))
              if non_finite(stats)]
    for name, stats in params:
        for i, label in enumerate(bad):
            if _same_tensor(stats, own[label]):
                finding.parameter = f"{finding.module}.{name}"
                finding.parts[i] += f" = {finding.parameter}"
                return
    if params:
        finding.parameter = f"{finding.module}.{params[0][0]}"


def _same_tensor(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return _identity(a) == _identity(b)


def _identity(stats: dict[str, Any]) -> str:
    """What msprobe recorded of a tensor: the same tensor, seen by two ops, has the same."""
    return repr([stats.get(k) for k in ("dtype", "shape", *STATS)])


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
        parts = [(label, stats, rms) for label, stats in tensors(value) if (rms := _rms(stats)) is not None and math.isfinite(rms)]
        source = max((known.get(_identity(stats), rms) for label, stats, rms in parts if not _is_output(entry, label)), default=0.0)
        for label, stats, rms in parts:
            if _is_output(entry, label):
                scale = scales[entry, label] = max(rms, source)
                known[_identity(stats)] = max(known.get(_identity(stats), 0.0), scale)
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
            if _is_output(entry, label) and label in old and (new := _rms(stats)) is not None and (then := _rms(old[label])) is not None
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
        match = _MODULE.match(entry)
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
            _factor(a, b, floor) for measure, floor in zip(measures, floors)
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
                if label.startswith("input") and _same_tensor(stats, move.stats):
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


def _json_number(value: float | None) -> float | str | None:
    """Strict JSON, as anomalies.jsonl writes it: ``"inf"`` for an infinite factor."""
    return value if value is None or math.isfinite(value) else str(value)


# -- the whole triage ------------------------------------------------------------------------


@dataclass(slots=True)
class Triage:
    """What triage found for the first anomaly of a run: the op (or why none
    is named), the dump it is in and, for a spike, the healthy dump it was
    compared with."""

    run: Path
    anomalies: list[Anomaly]
    finding: Finding | None = None
    dump: Dump | None = None
    healthy_dump: Dump | None = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def anomaly(self) -> Anomaly | None:
        return self.anomalies[0] if self.anomalies else None

    def as_json(self) -> dict[str, Any]:
        anomaly = self.anomaly
        return {
            "run": str(self.run),
            "anomalies": len(self.anomalies),
            "anomaly": None if anomaly is None else dict(anomaly.record, line=anomaly.line),
            "found": self.finding is not None,
            "dump": None if self.dump is None else str(self.dump.path),
            "healthy_dump": None if self.healthy_dump is None else str(self.healthy_dump.path),
            "op": None if self.finding is None else self.finding.as_json(),
            "reason": self.reason or None,
            "notes": self.notes,
            "warnings": self.warnings,
        }


def triage(run: Path) -> Triage:
    """Triage the first anomaly of ``run`` (its save_path).  Raises
    TriageInputError when ``run`` is not a directory or its anomalies.jsonl
    cannot be read; unreadable lines become ``warnings``."""
    if not run.is_dir():
        raise TriageInputError(f"{run} {'is not a directory' if run.exists() else 'does not exist'}; pass the save_path of a run")
    result = Triage(run, [])
    anomalies = read_anomalies(run, result.warnings)
    if not anomalies:
        result.reason = f"no anomalies recorded in {run / ANOMALY_FILE}"
        return result
    # The earliest is the cause; those after it are usually its consequences.
    result.anomalies = sorted(anomalies, key=lambda a: (a.step is None, a.step or 0, _time(a)))
    runs = list(dict.fromkeys(str(a.record["run"]) for a in anomalies if a.record.get("run") is not None))
    owner = owner_of(run)
    if len(runs) > 1 or (runs and owner is not None and runs != [owner]):
        result.warnings.append(f"{run / ANOMALY_FILE} names run(s) {', '.join(runs)}; the dumps belong to run {owner}")
    anomaly = result.anomalies[0]
    if anomaly.step is None:
        result.reason = "the anomaly has no step, so triage cannot tell which dumps follow it"
        return result
    dumps = [d for d in find_dumps(run) if d.step > anomaly.step]
    if not dumps:
        result.reason = (
            f"no msprobe dump after step {anomaly.step}: msprobe was not armed (no msprobe observer with "
            f"trigger: anomaly), or the run stopped before step {anomaly.step + 1}"
        )
        return result
    rank = anomaly.record["rank"]
    if not any(d.rank == rank for d in dumps):
        result.notes.append(f"rank {rank} has no dump after step {anomaly.step}; the dumps of rank(s) "
                            f"{', '.join(map(str, sorted({d.rank for d in dumps})))} are used instead")
    else:
        dumps = [d for d in dumps if d.rank == rank]
    if anomaly.rule == "non_finite":
        _non_finite(result, anomaly.step, dumps)
    else:
        _moved(result, anomaly, find_dumps(run), dumps)
    return result


def _time(anomaly: Anomaly) -> float:
    value = anomaly.record.get("time")
    return float(value) if isinstance(value, (int, float)) else math.inf


def _non_finite(result: Triage, step: int, dumps: list[Dump]) -> None:
    for dump in dumps:
        session = read_session(dump, result.notes)
        if session is not None and (finding := first_non_finite(session)) is not None:
            result.finding, result.dump = finding, dump
            return
    steps = sorted({d.step for d in dumps})
    result.reason = (
        f"none of the {len(dumps)} dump(s) after step {step} (steps {', '.join(map(str, steps))}) holds a NaN or Inf: "
        "the non-finite value did not recur in the dumped stages"
    )


def _moved(result: Triage, anomaly: Anomaly, every: list[Dump], after: list[Dump]) -> None:
    step, stage = anomaly.step or 0, anomaly.record["stage"]
    for armed in sorted(after, key=lambda d: d.stage != stage):  # the anomaly's own stage first; sort is stable
        earlier = [d for d in every if d.stage == armed.stage and d.rank == armed.rank and d.step < step]
        if not earlier:
            continue
        healthy = max(earlier, key=lambda d: (d.step, d.call == armed.call))
        after_session, healthy_session = read_session(armed, result.notes), read_session(healthy, result.notes)
        if after_session is None or healthy_session is None:
            continue
        result.dump, result.healthy_dump = armed, healthy
        result.finding = most_moved(after_session, healthy_session)
        if result.finding is None:
            result.reason = f"{armed.path} and {healthy.path} share no entry to compare"
        return
    stages = ", ".join(sorted({d.stage for d in after}))
    result.reason = (
        f"no healthy dump to compare with: no dump of {stages} before step {step} "
        f"(rank {', '.join(map(str, sorted({d.rank for d in after})))}); a {anomaly.rule} is triaged against the last "
        "dump of the same stage before the anomaly, so select an earlier step for msprobe too (e.g. steps: [1])"
    )


# -- printing ------------------------------------------------------------------------------


def render(result: Triage, console: Any) -> None:
    """A few lines for the terminal."""

    def say(label: str, text: str, style: str | None = None) -> None:
        console.print(f"{label:<8}{text}", markup=False, highlight=False, soft_wrap=True, style=style)

    anomaly = result.anomaly
    if anomaly is None:
        say("", result.reason)
        return
    say("anomaly", anomaly.describe(), "bold")
    if len(result.anomalies) > 1:
        later = sorted({str(a.record["step"]) for a in result.anomalies[1:]})
        say("", f"({len(result.anomalies) - 1} more recorded, step(s) {', '.join(later)}; the first is triaged)")
    if result.healthy_dump is not None and result.dump is not None:
        say("dumps", f"healthy {result.healthy_dump.path}  ->  after {result.dump.path}")
    elif result.dump is not None:
        say("dump", str(result.dump.path))
    finding = result.finding
    if finding is None:
        say("no op", result.reason, "yellow")
        return
    if finding.others is not None:
        output = "" if finding.factor is None else f"; its output norm x{finding.factor:.3g}"
        say("op", f"{finding.op}  (parameter {finding.parameter} moved x{finding.parameter_factor:.3g}, the median parameter "
            f"x{finding.others:.4g}: the first op to read it, {', '.join(finding.parts)}{output})", "bold red")
    elif finding.factor is None:
        say("op", f"{finding.op}  (first in execution order with a NaN/Inf: {', '.join(finding.parts)})", "bold red")
    else:
        largest = "the largest move" if finding.largest is None else (
            f"the earliest move of the order of the largest, {finding.largest[0]} x{finding.largest[1]:.3g}")
        say("op", f"{finding.op}  ({', '.join(finding.parts)} norm x{finding.factor:.3g}: {largest})", "bold red")
    say("module", f"{finding.module} ({finding.module_entry})" if finding.module else
        "none recorded (level L1 records no modules, and msprobe never hooks the root model)")
    if finding.parameter:
        moved = "" if finding.parameter_factor is None else f" (moved x{finding.parameter_factor:.3g})"
        say("param", finding.parameter + moved)
    source = finding.source
    say("source", f"{source['file']}:{source['line']} in {source['function']}: {source['code']}" if source else
        "no user frame in its call stack (stack.json missing, or every frame in torch/msprobe/the stdlib)")
