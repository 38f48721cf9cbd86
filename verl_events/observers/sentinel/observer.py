"""The sentinel: a cheap watcher on every stage that raises the alarm when a metric goes wrong.

At the end of each stage it reads the stage's scalars
(:func:`verl_events.observers.batch.metrics.extract_metrics`: verl's metrics, a few
reductions of the tensors the stage made, the training-inference gap) and
checks them against rules.  When one breaks a rule it

1. appends one :class:`~verl_events.observers.sentinel.record.AnomalyRecord`
   line to ``{save_path}/anomalies.jsonl`` (the record's module shows one).  Every rank
   appends to the same file, each line with one ``write`` on an ``O_APPEND``
   descriptor, so lines of several ranks never interleave;
2. logs one line at WARNING on the ``verl_events.sentinel`` logger;
3. sends the ``anomaly`` signal with the stage name as sender and
   ``event=AnomalyEvent(...)``: capture observers configured with
   ``trigger: anomaly`` capture the steps that follow.

A metric triggers at most once per step (the first rule it breaks); a step
that could not be resolved counts each stage on its own.  A failing write
is logged and training goes on; the signal is still sent.

Config::

    - name: sentinel
      non_finite: true            # every metric seen: NaN/inf is an anomaly (default true)
      check_names_after: 2        # steps before rule names no stage reported are warned about
      rules:
        actor/grad_norm: {above: 1000, spike: true}     # up, x2 the median and z 6, from step 5
        actor/entropy: {below: 0.01}
        gap/log_prob_abs_max: {above: 2.0}
        critic/vf_loss: {spike: true, non_finite: false}

Per metric, any of:

* ``above: X`` / ``below: X``: a finite number; the value must not be
  greater than ``above`` / less than ``below``;
* ``spike: true`` or ``{z, ratio, warmup, window, direction}``: the value
  is a spike when it is both *unusual* and *large* against the metric's
  recent history at that stage (the formula, and the measurements behind
  each default: :mod:`verl_events.observers.sentinel.spike`):

  - ``z`` (default 6): its robust z-score (Iglewicz and Hoaglin's modified
    z) must exceed it, the noise never taken as less than 5 % of the
    median, so that a few quiet values cannot make a small change score
    high;
  - ``ratio`` (default 2): it must be at least twice the median (at most
    half of it for ``down``), so that an unusual but small change is not a
    spike; healthy runs stay within x1.5;
  - ``direction`` (default ``up``; ``down`` or ``both``): the metrics a
    spike rule is for, norms and losses, go wrong upwards, and a healthy
    gradient norm falls as often as it rises;
  - ``warmup`` (default 4, at least 3) **steps** of values are learnt
    before any is judged: the first steps are the least typical, and the
    median of four is not moved by one odd first value;
  - ``window`` (default 50): the history is the last 50 finite values.

  A stage that runs several times a step (``train_batch``, once per
  mini-batch) adds one value per run;
* ``non_finite: true/false``: this metric's own switch for the NaN/inf rule.

The non-finite rule fires for a value that is NaN or infinite, and for a
tensor's ``*/nonfinite_count`` above 0.  Checks run in the order
non_finite, above, below, spike.

Rule names no stage has reported by the time step ``check_names_after + 1``
begins (or at close, for a shorter run) are warned about once, with the
names that were reported: a rule with a typo never fires.  A process only
sees the stages it runs, so a metric of a role another process holds is
reported (and watched) there.

Replays (:mod:`verl_events.capture.replay`): when an anomaly this sentinel raised
makes its stage run again for the armed capture observers, the sentinel
judges the replay (:mod:`.replay`): one :class:`~.record.ReplayRecord`
line in ``{save_path}/replays.jsonl`` with the verdict, reproducible or
transient, one log line at WARNING, and the stage's tensor inputs kept in
the replay's directory.

Spike margins: :meth:`SentinelObserver.margins` says, for every metric
with a spike rule and every stage that reported it, how many values were
judged and the largest ratio and robust z among them (a healthy run shows
how much room the rule leaves); they are logged at INFO when the observer
closes.

Option values are checked at install, naming the option path:
``option rules.actor/grad_norm.above: 'big' is not allowed; use a number``.

Cost: one :func:`extract_metrics` per stage (one device-to-host copy for
the tensor reductions), and a dict lookup per metric;
``benchmarks/sentinel.py`` measures it against the demo's step time.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from verl_events import (
    AnomalyEvent,
    InstallContext,
    Observer,
    StageEnd,
    Writes,
    prepare_output_dir,
    send_anomaly,
    stage_header,
)
from verl_events.config import check_count
from verl_events.layout import run_id

from ..batch import extract_metrics
from .record import AnomalyRecord, ReplayRecord, anomaly_log_path, record_files, replay_log_path
from .replay import describe, judge, keep_inputs
from .rules import parse_rules
from .spike import SpikeHistory, SpikeMargin

__all__ = ["SentinelObserver"]

logger = logging.getLogger("verl_events.sentinel")

_COUNT_SUFFIX = "/nonfinite_count"


class SentinelObserver(Observer):
    """Watch every selected stage's metrics; on a broken rule, record it and send ``anomaly``.

    Options (see the module docstring): ``rules``, ``non_finite``,
    ``check_names_after``.  Thread safe: the per-metric state and the file
    are guarded by one lock; metrics are read outside it.
    """

    passive = True
    wants_result = True
    #: Read by install: observers with ``trigger: anomaly`` need a sender.
    sends_anomalies = True
    sees_replays = True  # to judge them

    def __init__(
        self,
        rules: Mapping[str, Any] | None = None,
        non_finite: bool = True,
        check_names_after: int = 2,
    ) -> None:
        self.rules = parse_rules(rules)
        self.non_finite = non_finite
        self.check_names_after: int = check_count(
            check_names_after, "option check_names_after", allowed="an integer of at least 1"
        )
        self._root = Path()
        self._strict = False
        self._lock = threading.Lock()
        self._fds: dict[Path, int] = {}
        self._run_id: Callable[[], str] = run_id  # until setup hands over the installation's
        self._history: dict[tuple[str, str], SpikeHistory] = {}  # (stage, metric) -> its spike rule's history
        self._fired: dict[str, tuple[str, int]] = {}  # metric -> ("step", N) or ("seq", N) of its last trigger
        self._unreadable: set[tuple[str, str]] = set()  # (stage, part) of metrics that could not be read, logged once
        self._names_seen: set[str] | None = set() if self.rules else None  # None: checked, or nothing to check
        self._steps_seen: set[int] = set()
        # (stage, step, rank) -> the anomalies raised there, for a replay to be judged by; the newest step only.
        self._raised: dict[tuple[str, int, int], list[AnomalyEvent]] = {}

    writes = Writes("anomaly record file(s)", record_files, "triage", "verl_events.apps.triage.render")

    def setup(self, context: InstallContext) -> None:
        self._root = Path(context.save_path)
        self._strict = context.strict
        self._run_id = context.run_id
        prepare_output_dir(self._root)

    def describe(self) -> str:
        watched = ", ".join(sorted(self.rules)) or "none"
        return f"non-finite values {'on' if self.non_finite else 'off'} for every metric; rules for: {watched}"

    def margins(self) -> list[SpikeMargin]:
        """How close each metric with a spike rule came to it so far, one per
        stage that reported it, by metric then stage (see the module docstring)."""
        with self._lock:
            keys = sorted(self._history, key=lambda key: (key[1], key[0]))
            return [self._history[key].margin(*key) for key in keys]

    # -- the stage's end ----------------------------------------------------

    def on_stage_end(self, event: StageEnd) -> None:
        if event.error is not None or event.result is None:
            return
        if event.replay:
            self._judge_replay(event)
            return
        metrics = extract_metrics(event.stage, event.result, event.inputs, self._unreadable)
        if not metrics and self._names_seen is None:
            return
        triggered: list[AnomalyEvent] = []
        with self._lock:
            for name, value in metrics.items():
                found = self._check(event, name, value)
                if found is not None:
                    triggered.append(found)
            unknown = self._note_names(event.step, metrics)
        if unknown:
            self._warn_unknown(*unknown)
        if triggered and event.step is not None:
            with self._lock:
                if any(step != event.step for _, step, _ in self._raised):
                    self._raised.clear()
                self._raised.setdefault((event.stage, event.step, event.rank), []).extend(triggered)
        for found in triggered:
            self._raise_alarm(found)

    def _judge_replay(self, event: StageEnd) -> None:
        """The verdict on a replay of a stage this rank raised anomalies at."""
        assert event.step is not None  # only stages with a step replay
        with self._lock:
            raised = self._raised.pop((event.stage, event.step, event.rank), None)
        if raised is None:
            return  # replayed for another rank's anomaly: nothing to judge here
        verdict, again = judge(
            raised, extract_metrics(event.stage, event.result, event.inputs, self._unreadable), self.rules
        )
        try:
            inputs = keep_inputs(self._root, event)
        except Exception as exc:
            if self._strict:
                raise
            inputs = None
            logger.error("sentinel: could not keep the inputs of the replay: %s: %s", type(exc).__name__, exc)
        said = describe(verdict, again)
        logger.warning("sentinel: step %s %s rank %d: replayed; %s", event.step, event.stage, event.rank, said)
        names = tuple(dict.fromkeys(found.metric for found in raised))
        record = ReplayRecord(
            **stage_header(event, self._run_id),
            verdict=verdict,
            anomalies=names,
            again=again,
            inputs=inputs,
        )
        self._append_line(replay_log_path(self._root), record.to_json(), f"the replay's verdict at step {event.step}")

    def _check(self, event: StageEnd, name: str, value: float) -> AnomalyEvent | None:
        """The first rule ``value`` breaks, as an AnomalyEvent, if the metric has
        not triggered this step yet (lock held)."""
        rule = self.rules.get(name)
        broken: tuple[str, float | None, str] | None = None
        watch_non_finite = self.non_finite if rule is None or rule.non_finite is None else rule.non_finite
        finite = math.isfinite(value)
        if watch_non_finite:
            if not finite:
                broken = ("non_finite", None, f"{name} is {value}")
            elif name.endswith(_COUNT_SUFFIX) and value > 0:
                broken = ("non_finite", None, f"{value:g} non-finite element(s) in {name[: -len(_COUNT_SUFFIX)]}")
        when = ("step", event.step) if event.step is not None else ("seq", event.seq)
        if rule is not None:
            if broken is None and rule.above is not None and value > rule.above:
                broken = ("above", rule.above, f"{name} {value:g} is above {rule.above:g}")
            if broken is None and rule.below is not None and value < rule.below:
                broken = ("below", rule.below, f"{name} {value:g} is below {rule.below:g}")
            if rule.spike is not None and finite:
                history = self._history.get((event.stage, name))
                if history is None:
                    history = self._history[(event.stage, name)] = SpikeHistory(rule.spike)
                spike = history.observe(value, when, event.step)
                if broken is None and spike is not None:
                    broken = ("spike", spike[0], f"{name} {value:g} is {spike[1]}")
        if broken is None:
            return None
        if self._fired.get(name) == when:
            return None
        self._fired[name] = when
        rule_name, baseline, detail = broken
        return AnomalyEvent(event.step, event.stage, event.rank, name, value, rule_name, baseline, detail)

    # -- the alarm ----------------------------------------------------------

    def _raise_alarm(self, found: AnomalyEvent) -> None:
        logger.warning(
            "sentinel: step %s %s rank %d: %s (rule %s)", found.step, found.stage, found.rank, found.detail, found.rule
        )
        self._append(found)
        send_anomaly(found, sender="sentinel", strict=self._strict)

    def _append(self, found: AnomalyEvent) -> None:
        record = AnomalyRecord.from_event(found, run=self._run_id(), time=time.time())
        self._append_line(
            anomaly_log_path(self._root), record.to_json(), f"the anomaly ({found.metric} at step {found.step})"
        )

    def _append_line(self, path: Path, text: str, what: str) -> None:
        """One line, one write; a failure is logged, never raised into training (unless strict)."""
        line = (text + "\n").encode("utf-8")
        try:
            with self._lock:
                fd = self._fds.get(path)
                if fd is None:
                    fd = self._fds[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"wrote {written} of {len(line)} bytes")
        except Exception as exc:
            if self._strict:
                raise
            logger.error("sentinel: could not record %s in %s: %s: %s", what, path, type(exc).__name__, exc)

    # -- rule names no stage reported -------------------------------------

    def _note_names(
        self, step: int | None, metrics: Mapping[str, float]
    ) -> tuple[list[str], list[int], list[str]] | None:
        """Record the names seen; once ``check_names_after`` steps are over, the
        rule names never seen (lock held).  None until then, and after."""
        if self._names_seen is None:
            return None
        self._names_seen.update(metrics)
        if step is None or step in self._steps_seen:
            return None
        if len(self._steps_seen) < self.check_names_after:
            self._steps_seen.add(step)
            return None
        return self._unknown_names()

    def _unknown_names(self) -> tuple[list[str], list[int], list[str]] | None:
        seen, self._names_seen = self._names_seen, None
        if not seen:
            return None  # nothing was reported here at all: nothing to compare with
        unknown = sorted(set(self.rules) - seen)
        return (unknown, sorted(self._steps_seen), sorted(seen)) if unknown else None

    def _warn_unknown(self, unknown: list[str], steps: list[int], seen: list[str]) -> None:
        when = f"step(s) {', '.join(map(str, steps))}" if steps else "this run"
        logger.warning(
            "sentinel: rules name %s, which no stage of this process reported in %s, so %s never trigger; "
            "the metrics reported here are: %s. A typo? (a metric of a role another process runs is watched there)",
            ", ".join(map(repr, unknown)),
            when,
            "it would" if len(unknown) == 1 else "they would",
            ", ".join(seen),
        )

    def close(self) -> None:
        with self._lock:
            unknown = self._unknown_names() if self._names_seen is not None else None
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
        if unknown:
            self._warn_unknown(*unknown)
        for margin in self.margins():
            logger.info("sentinel: spike margin of %s", margin.describe())
