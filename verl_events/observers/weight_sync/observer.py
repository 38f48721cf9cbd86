"""The weight_sync observer: did the rollout engine get the weights the trainer sent?

Config::

    - name: weight_sync
      receipt_engine: my_pkg.engine:receipt  # optional (default null: no receipt)
      canary: false            # true: also the canary, on every rank (see below)
      canary_tolerance: 0.001  # the smallest |Δ log p| (nats) that is past the tolerance
      canary_engine: verl_events.observers.weight_sync.served:vllm_canary  # needed by canary: true

At every weight sync it selects (verl's ``update_weights`` stage, on every
trainer rank) it keeps:

* a **manifest** of what the trainer sent, taken as the tensors pass the
  rollout adapter's ``update_weights`` (the ``naive`` engine) or a checkpoint
  engine's ``send_weights`` (every other engine) in the trainer's process
  (:func:`verl_events.watch_payloads`): each tensor's name, shape, dtype,
  size, a fingerprint (:mod:`.fingerprint`) and its count of NaN and
  infinite values;
* a **receipt** of what the engine holds afterwards: ``receipt_engine``, a
  function ``(rank) -> {name: (dtype, fingerprint)}`` that fingerprints the
  engine's own weights in the engine's process (for the CPU rollout, its Ray
  actor); none by default (the ledger then holds what was sent only, as
  ``describe`` says); not asked, nor the canary, where a checkpoint engine's
  receiver loads the weights in its own process after the send returned;
* whether the optimizer stepped since the previous sync: an
  ``actor_update`` ended without error on this rank in between (null when
  the observer's stages leave ``actor_update`` out);
* with ``canary: true``, the canary (:mod:`.canary`): a few fixed sequences
  through the trainer's actor model (the stage's model) and through the
  engine's (``canary_engine``, a function ``(rank, ids) -> canary.Side``
  run in the engine's process: :mod:`.served` has vLLM's and SGLang's; no
  default, and ``canary: true`` without one is refused), compared log-prob
  by log-prob and layer by layer.  Under FSDP the trainer's forward gathers
  weights from every rank: every rank runs it, so the canary refuses a
  ``ranks`` selection.

It judges them (:mod:`.judge`), appends one line per sync and rank to
``weight_sync.jsonl`` (:mod:`.record`; a sync whose tensors passed
nowhere this process watches gets its line too, saying why it is unchecked), and sends each alarm as an
``anomaly`` (stage ``update_weights``, metric ``weight_sync/<kind>``), so an
armed capture observer starts and trackers and ``verl-events diagnose`` see
it.  ``verl-events weights RUN`` reads the ledger back.

Passive.  verl runs one sync at a time in a process; the state kept from
one sync to the next is locked all the same.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_events import (
    AnomalyEvent,
    ConfigError,
    InstallContext,
    Observer,
    Payload,
    StageEnd,
    Writes,
    prepare_output_dir,
    send_anomaly,
    unwatch_payloads,
    watch_payloads,
)
from verl_events.config import import_target, is_import_path
from verl_events.layout import run_id

from .._lines import append_line
from .judge import Entry, Receipt, canary_alarm, judge, left_out
from .record import STAGE, SyncRecord, weight_sync_files, weight_sync_log_path
from .sending import Sending, Sent

if TYPE_CHECKING:
    from .canary import CanaryCheck

__all__ = ["OPTIMIZER_STAGE", "WeightSyncObserver"]

logger = logging.getLogger("verl_events.weight_sync")

#: The stage whose end means the optimizer stepped.
OPTIMIZER_STAGE = "actor_update"
#: The canary's engine side on vLLM (:mod:`.served`), the example the messages give.
_SERVED_CANARY = "verl_events.observers.weight_sync.served:vllm_canary"


class WeightSyncObserver(Observer):
    """Manifest, receipt and alarms at every selected weight sync (see the module docstring)."""

    passive = True
    sends_anomalies = True
    writes = Writes("weight-sync ledger(s)", weight_sync_files, "weights", "verl_events.apps.weights")

    def __init__(
        self,
        receipt_engine: str | None = None,
        canary: bool = False,
        canary_tolerance: float = 1e-3,
        canary_engine: str | None = None,
    ) -> None:
        if receipt_engine is not None and not is_import_path(receipt_engine):
            raise ConfigError(
                f"option receipt_engine: {receipt_engine!r} is not allowed; use an import path like "
                "'my_pkg.engine:receipt', or null for no receipt"
            )
        if canary_engine is not None and not is_import_path(canary_engine):
            raise ConfigError(
                f"option canary_engine: {canary_engine!r} is not allowed; use an import path like {_SERVED_CANARY!r}"
            )
        if canary and canary_engine is None:
            raise ConfigError(
                "option canary: true needs option canary_engine, the import path of a function (rank, ids) -> "
                f"canary.Side run in the engine's process; for vLLM {_SERVED_CANARY!r} (SGLang: :sglang_canary); "
                "there is no default (docs/weight-sync.md)"
            )
        if isinstance(canary_tolerance, bool) or not (
            isinstance(canary_tolerance, int | float) and 0 < canary_tolerance < math.inf
        ):
            raise ConfigError(
                f"option canary_tolerance: {canary_tolerance!r} is not allowed; use a number of nats > 0, such as 0.001"
            )
        self.receipt_engine = receipt_engine
        self.canary = canary
        self.canary_tolerance = float(canary_tolerance)
        self.canary_engine: str | None = canary_engine
        self._receipt: Any = None
        self._canary: Any = None
        self._baseline: Any = None  # this rank's first canary check
        self._lock = threading.Lock()
        self._root = Path()
        self._strict = False
        self._run_id: Callable[[], str] = run_id  # until setup hands over the installation's
        self._fingerprint: Any = None
        self._nonfinite: Any = None
        self._dtype_name: Any = None
        # The sync being sent, the last one sent, and this rank's previous sync.
        self._sending: Sending | None = None
        self._sent: list[Sending] = []  # the payloads of the sync under way
        self._previous_kinds: dict[str, frozenset[str]] = {}  # what the previous sync sent, by kind
        self._previous: dict[str, Entry] | None = None
        self._previous_receipt: Receipt | None = None
        self._stepped = False
        self._unseen: str | None = None  # why the sync being sent cannot be seen, when the tap said
        self._warned_no_payload = False

    def setup(self, context: InstallContext) -> None:
        self._run_id = context.run_id
        from .fingerprint import dtype_name, fingerprint, nonfinite_count  # torch: only where the observer runs

        self._fingerprint, self._nonfinite, self._dtype_name = fingerprint, nonfinite_count, dtype_name
        if self.canary and self.selection.ranks is not None:
            raise ConfigError(
                f"option canary: the canary runs the trainer's forward on every rank at once (under FSDP each "
                f"rank gathers weights from the others), so weight_sync with canary: true must select every rank, "
                f"not ranks {sorted(self.selection.ranks)}; drop its ranks, or set canary: false"
            )
        self._root = Path(context.save_path)
        self._strict = context.strict
        prepare_output_dir(self._root)
        watch_payloads(self)

    def close(self) -> None:
        unwatch_payloads(self)

    def describe(self) -> str:
        receipt = f"the engine's receipt through {self.receipt_engine}" if self.receipt_engine else "no receipt"
        canary = f", the canary through {self.canary_engine}" if self.canary else ""
        return f"a manifest of every {STAGE} payload, {receipt}{canary}, alarms as anomalies"

    # What passes the rollout adapter (verl_events.bus.weights.PayloadWatcher).

    def began(self, payload: Payload) -> None:
        with self._lock:
            self._sending = Sending(payload)

    def tensor(self, name: str, tensor: Any) -> None:
        started = time.perf_counter()
        entry = Entry(
            shape=tuple(tensor.shape),
            dtype=self._dtype_name(tensor.dtype) or str(tensor.dtype),
            nbytes=tensor.numel() * tensor.element_size(),
            fingerprint=self._fingerprint(tensor),
            nonfinite=self._nonfinite(tensor),
        )
        with self._lock:
            if self._sending is not None:
                self._sending.manifest[name] = entry
                self._sending.seconds += time.perf_counter() - started

    def unseen(self, payload: Payload, why: str) -> None:
        with self._lock:
            self._unseen = why

    def ended(self, payload: Payload, complete: bool) -> None:
        with self._lock:
            sending, self._sending = self._sending, None
            if sending is not None:
                sending.complete = complete
                self._sent.append(sending)

    # Stages.

    def on_stage_end(self, event: StageEnd) -> None:
        if event.stage == OPTIMIZER_STAGE and event.error is None:
            with self._lock:
                self._stepped = True
            return
        if event.stage != STAGE:
            return
        with self._lock:
            sent, self._sent = self._sent, []
            unseen, self._unseen = self._unseen, None
        if event.error is not None:
            return  # the sync raised: the timing log and the watchdog say so
        if not sent:
            self._unchecked(event, unseen)
            return
        self._judge(event, Sent.of(sent))

    def _judge(self, event: StageEnd, sent: Sent) -> None:
        # An engine's receiver loads in its own process, maybe after this rank's send returned:
        # asked now, the engine would answer with the weights it had before (a false alarm).
        engine_loaded = sent.last.loaded_on_return
        started = time.perf_counter()
        receipt = self._ask_receipt(event.rank) if engine_loaded else None
        receipt_s = time.perf_counter() - started
        started = time.perf_counter()
        canary = self._run_canary(event) if engine_loaded else None
        canary_s = time.perf_counter() - started
        with self._lock:
            stepped: bool | None = self._stepped if self._watches_optimizer() else None
            verdict = judge(
                sent.manifest,
                self._previous,
                receipt,
                self._previous_receipt,
                optimizer_stepped=stepped,
                adapter=sent.adapter,
                missing=left_out(self._previous_kinds, sent.kinds),
            )
            self._previous, self._previous_receipt, self._stepped = sent.manifest, receipt, False
            self._previous_kinds = self._previous_kinds | sent.kinds
        record = SyncRecord(
            run=self._run_id(),
            step=event.step if event.step is not None else sent.last.step,
            rank=event.rank,
            time=time.time(),
            complete=sent.complete,
            tensors=len(sent.manifest),
            bytes=sum(entry.nbytes for entry in sent.manifest.values()),
            adapter=sent.adapter,
            adapter_tensors=verdict.adapter_tensors,
            changed=verdict.changed,
            unchanged=verdict.unchanged,
            optimizer_stepped=stepped,
            nonfinite=verdict.nonfinite,
            receipt=verdict.receipt,
            canary=canary.as_json() if canary is not None else None,
            alarms=verdict.alarms + ([canary_alarm(canary)] if canary is not None and canary.past else []),
            seconds={
                "manifest": round(sent.seconds, 6),
                "receipt": round(receipt_s, 6),
                **({"canary": round(canary_s, 6)} if canary is not None else {}),
            },
            seen_at=sent.last.seen_at,
            payloads=sent.payloads,
        )
        append_line(weight_sync_log_path(self._root), record.to_json())
        for alarm in record.alarms:
            self._send(record, alarm.kind, alarm.count, alarm.detail)

    def _send(self, record: SyncRecord, kind: str, count: int, detail: str) -> None:
        found = AnomalyEvent(
            step=record.step,
            stage=STAGE,
            rank=record.rank,
            metric=f"weight_sync/{kind}",
            value=float(count),
            rule=kind,
            detail=f"weight sync of step {record.step}: {detail}",
        )
        logger.warning("weight_sync: rank %d: %s", record.rank, found.detail)
        send_anomaly(found, sender="weight_sync", strict=self._strict)

    def _ask_receipt(self, rank: int) -> Receipt | None:
        if self.receipt_engine is None:
            return None
        try:
            if self._receipt is None:
                # Imported at first use, not at setup: the engine's module may be the one whose
                # import of verl installed the observers (verl_cpu's shim imports hf_rollout).
                self._receipt = import_target(self.receipt_engine, "option receipt_engine")
            held = self._receipt(rank)
        except Exception as exc:
            if self._strict:
                raise
            logger.warning(
                "weight_sync: no receipt from the engine through %s (%s: %s); the ledger compares what was "
                "sent only, from now on",
                self.receipt_engine,
                type(exc).__name__,
                exc,
            )
            self.receipt_engine = None
            return None
        receipt = {str(name): (self._dtype_name(dtype), str(print_)) for name, (dtype, print_) in held.items()}
        unknown = next((name for name, (dtype, _) in receipt.items() if dtype is None), None)
        if unknown is not None:
            # Taken as "another dtype", its bytes would never be compared and a change passed.
            logger.warning(
                "weight_sync: the engine's receipt gives %s the dtype %r, which names no torch dtype; this "
                "sync's receipt is not used (spell dtypes as torch does: 'float32' or 'torch.float32')",
                unknown,
                held[unknown][0],
            )
            return None
        return {name: (str(dtype), fingerprint) for name, (dtype, fingerprint) in receipt.items()}

    def _run_canary(self, event: StageEnd) -> CanaryCheck | None:
        """The canary of this sync (None when it cannot run: said once).

        The trainer's forward runs on every rank at every sync, also once this rank's engine
        side has failed: under FSDP the forward is collective, and a rank that left it out
        would leave its peers waiting.  Only a forward that fails, which fails alike on every
        rank (no model, no vocabulary), turns the canary off."""
        from .canary import canary_ids, compare, forward, vocab_size

        if not self.canary:
            return None
        if event.model is None:
            self._stop_canary(f"the {STAGE} stage has no model (the trainer's actor model was not found)")
            return None
        try:
            ids = canary_ids(vocab_size(event.model))
            trainer = forward(event.model, ids)
        except Exception as exc:
            if self._strict:
                raise
            self._stop_canary(f"the trainer's forward failed: {type(exc).__name__}: {exc}")
            return None
        if self.canary_engine is None:
            return None  # this rank's engine side failed before: the forward above kept its peers company
        try:
            if self._canary is None:
                self._canary = import_target(self.canary_engine, "option canary_engine")
            engine = self._canary(event.rank, ids)
            check = compare(trainer, engine, self._baseline, self.canary_tolerance)
        except Exception as exc:
            if self._strict:
                raise
            logger.warning(
                "weight_sync: rank %d: the canary's engine side failed (%s: %s); this rank's syncs are compared "
                "without it from now on",
                event.rank,
                type(exc).__name__,
                exc,
            )
            self.canary_engine = None
            return None
        if self._baseline is None:
            self._baseline = check
        return check

    def _stop_canary(self, why: str) -> None:
        logger.warning("weight_sync: the canary cannot run (%s); it is off from now on", why)
        self.canary = False

    def _watches_optimizer(self) -> bool:
        stages = self.selection.stages
        return stages is None or OPTIMIZER_STAGE in stages

    def _unchecked(self, event: StageEnd, why: str | None) -> None:
        """The sync's line, saying why nothing of it could be checked: 1 sync of 4 in the
        ledger must never read as the whole run."""
        why = why or (
            "no tensor passed a rollout adapter's update_weights or a checkpoint engine's send_weights in this "
            "process (an engine that sends from elsewhere?)"
        )
        record = SyncRecord.not_seen(run=self._run_id(), step=event.step, rank=event.rank, time=time.time(), why=why)
        append_line(weight_sync_log_path(self._root), record.to_json())
        if not self._warned_no_payload:
            self._warned_no_payload = True
            logger.warning("weight_sync: rank %d: %s at step %s is unchecked: %s", event.rank, STAGE, event.step, why)
