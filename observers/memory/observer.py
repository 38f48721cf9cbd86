"""The memory observer: how much memory each stage took, on the host and on the device.

Config::

    - name: memory
      record_history: false      # true: CUDA's allocator history, tagged by stage, and a snapshot
                                 # at an out-of-memory (see .history)
      history_entries: 100000    # the history's ring: the last this many allocator events
      forecast: true             # warn before a stage whose step's tokens predict more memory
                                 # than is left (see .forecast)

For every stage it selects, on every rank, one line in
``{save_path}/memory/rank{R}.jsonl`` (:mod:`.record`):

* **host**: the process's resident memory when the stage began and ended,
  and its peak in between (:mod:`.host`: the kernel's own high-water mark,
  reset when the stage began, so no spike is missed);
* **cgroup**: the memory cgroup's limit, usage and OOM-kill count when it
  ended, where readable (:mod:`.cgroup`);
* **an out-of-memory error** the stage raised (torch's CPU, CUDA or NPU
  allocator, Python's ``MemoryError``): where, and the bytes it asked for
  (:mod:`.oom`);
* **device** (CUDA, Ascend NPU, when present): torch's allocated and
  reserved bytes at begin and end, their peaks over the stage, and the
  whole device's used bytes (:mod:`.device`; it says what resetting the
  peaks changes in verl's own metrics).

With ``forecast`` (the default) each line also carries the step's
``tokens`` (:mod:`..batch.tokens`), and a stage whose step's tokens predict
more growth than is left is warned about when it begins: logged, sent as an
anomaly and kept in its line (:mod:`.forecast`).  For that the observer
asks for the stages' inputs and results (``wants_result``), by reference.

The peaks are process-wide and reset when a stage begins; nested and
concurrent stages each keep theirs (:mod:`.peaks`).  Passive.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from verl_events import (
    AnomalyEvent,
    ConfigError,
    InstallContext,
    Observer,
    StageEnd,
    StageEvent,
    anomaly,
    prepare_output_dir,
)
from verl_events.config import check_count
from verl_events.layout import run_id

from ..batch import TokenCounts, token_counts
from .cgroup import CgroupReader, find_cgroup
from .device import DeviceGauge, device_module
from .forecast import Forecast, Forecaster, Headroom, host_headroom
from .history import History, cuda_oom_attacher
from .host import HostGauge
from .oom import out_of_memory
from .peaks import PeakTracker
from .record import MemoryRecord, memory_files, memory_log_path

__all__ = ["MemoryObserver"]

logger = logging.getLogger("verl_events.memory")


class MemoryObserver(Observer):
    """Host, cgroup and device memory of every selected stage (see the module docstring)."""

    passive = True
    sends_anomalies = True
    output_noun = "memory log(s)"

    def __init__(self, record_history: bool = False, history_entries: int = 100_000, forecast: bool = True) -> None:
        for name, value in (("record_history", record_history), ("forecast", forecast)):
            if not isinstance(value, bool):
                raise ConfigError(f"option {name}: {value!r} is not allowed; use true or false")
        self.record_history = record_history
        self.forecast = forecast
        self.wants_result = forecast  # the step's tokens are read from the stages' inputs and results
        self._forecaster = Forecaster()
        self._step_tokens: dict[int, tuple[int, TokenCounts]] = {}  # rank -> (step, its tokens)
        self._warned: dict[int, list[Forecast]] = {}  # an open stage's seq -> its warnings
        self._token_failure_logged = False
        self.history_entries = check_count(
            history_entries, "option history_entries", allowed="a number of allocator events >= 1", minimum=1
        )
        self._history: History | None = None
        self._root = Path()
        self._gauge = HostGauge()
        self._host = PeakTracker(self._gauge)
        self._logs: dict[int, tuple[int, int]] = {}  # rank -> (pid, descriptor) of its log
        self._device: PeakTracker | None = None
        self._device_kind: str | None = None
        self._device_checked = False
        self._cgroup = CgroupReader(None)
        self._lock = threading.Lock()
        self._begun: dict[int, tuple[list[int] | None, list[int] | None]] = {}
        self._run: str | None = None
        self._warned_no_reset = False

    def outputs(self, save_path: Path) -> list[Path]:
        return memory_files(save_path)

    def setup(self, context: InstallContext) -> None:
        self._root = Path(context.save_path)
        prepare_output_dir(self._root)
        self._cgroup = CgroupReader(find_cgroup())
        if self.record_history:
            self._start_history()

    def _start_history(self) -> None:
        import torch  # asked for: the history is torch's

        found = device_module()
        if found is None or found[0] != "cuda":
            logger.warning(
                "memory: record_history needs CUDA, and this process has %s: the per-stage figures are recorded, "
                "the allocator history and the out-of-memory snapshot are not",
                "no device" if found is None else found[0],
            )
            return
        self._history = History(torch.cuda.memory, cuda_oom_attacher(), self._root, self.history_entries)
        self._history.start()

    def describe(self) -> str:
        history = (
            f"; CUDA allocator history ({self.history_entries} events) and a snapshot at an OOM"
            if self.record_history
            else ""
        )
        forecast = "; a warning before a stage whose step's tokens predict more than is left" if self.forecast else ""
        return f"host (resident, peak), cgroup and device memory of every selected stage{history}{forecast}"

    def on_stage_begin(self, event: StageEvent) -> None:
        if self._history is not None:
            self._history.stage_begins(event.seq, event.stage, event.step, event.rank)
        device = self._device_tracker()
        begun = (self._host.begin(event.seq), device.begin(event.seq) if device is not None else None)
        with self._lock:
            self._begun[event.seq] = begun
        if self.forecast and event.step is not None:
            self._check_forecast(event, begun[0], begun[1])

    def on_stage_end(self, event: StageEnd) -> None:
        if self._history is not None:
            self._history.stage_ends(event.seq)
        with self._lock:
            host_begin, device_begin = self._begun.pop(event.seq, (None, None))
            warned = self._warned.pop(event.seq, None)
        host = self._host.end(event.seq)
        device = self._device.end(event.seq) if self._device is not None else None
        tokens = self._learn(event, host_begin, host, device_begin, device) if self.forecast else None
        if not self._host.resets and not self._warned_no_reset:
            self._warned_no_reset = True
            logger.warning(
                "memory: /proc/self/clear_refs cannot be written here: a stage's host peak is the larger of its "
                "begin and end figures, and a spike in between is missed"
            )
        cgroup = self._cgroup.read()
        record = MemoryRecord(
            run=self._run_id(),
            step=event.step,
            stage=event.stage,
            rank=event.rank,
            role=event.role,
            time=time.time(),
            pid=os.getpid(),
            error=type(event.error).__name__ if event.error is not None else None,
            host_begin_bytes=host_begin[0] if host_begin else None,
            host_peak_bytes=host[1][0] if host else None,
            host_end_bytes=host[0][0] if host else None,
            host_peak="reset" if self._host.resets else "begin_end",
            device_peak_bytes=device[1][0] if device else None,
            device=self._device_figures(device_begin, device),
            oom=_oom(event.error),
            tokens=tokens,
            forecast=[found.to_dict() for found in warned] if warned else None,
            cgroup=None
            if cgroup is None
            else {
                "version": cgroup.version,
                "path": str(self._cgroup.found[1]) if self._cgroup.found else None,
                "limit_bytes": cgroup.limit_bytes,
                "usage_bytes": cgroup.usage_bytes,
                "oom_kills": cgroup.oom_kills,
            },
        )
        os.write(self._log(event.rank), (record.to_json() + "\n").encode())

    # -- the forecast (.forecast) ----------------------------------------------

    def _check_forecast(self, event: StageEvent, host_begin: list[int] | None, device_begin: list[int] | None) -> None:
        """Warn when this step's tokens predict more growth than is left; never raises."""
        with self._lock:
            known = self._step_tokens.get(event.rank)
            if known is None or known[0] != event.step:
                return
            tokens = known[1].tokens
            host = self._forecaster.expect(event.rank, event.stage, "host", tokens)
            device = self._forecaster.expect(event.rank, event.stage, "device", tokens)
        if host is None and device is None:
            return
        found: list[Forecast] = []
        if host is not None and host_begin is not None:
            now = self._cgroup.read()
            headroom = host_headroom(now.limit_bytes if now else None, now.usage_bytes if now else None)
            if headroom is not None and host[0] > headroom.bytes:
                found.append(Forecast(event.stage, "host", tokens, host[0], headroom, host[1], host[2]))
        gauge = self._device.gauge if self._device is not None else None
        if device is not None and device_begin is not None and isinstance(gauge, DeviceGauge):
            used, total = gauge.device_used()
            if device[0] > total - used:
                found.append(
                    Forecast(
                        event.stage, "device", tokens, device[0], Headroom(total - used, "device"), device[1], device[2]
                    )
                )
        if not found:
            return
        with self._lock:
            self._warned[event.seq] = found
        for warning in found:
            sentence = warning.sentence(event.step, event.rank)
            logger.warning("%s", sentence)
            try:
                anomaly.send(
                    event.stage,
                    event=AnomalyEvent(
                        step=event.step,
                        stage=event.stage,
                        rank=event.rank,
                        metric=f"memory_forecast/{warning.kind}_bytes",
                        value=float(warning.expected_bytes),
                        rule="forecast",
                        baseline=float(warning.headroom.bytes),
                        detail=sentence,
                    ),
                )
            except Exception:
                logger.exception("memory: a receiver of the anomaly signal failed for the forecast of %s", event.stage)

    def _learn(
        self,
        event: StageEnd,
        host_begin: list[int] | None,
        host: tuple[list[int], list[int]] | None,
        device_begin: list[int] | None,
        device: tuple[list[int], list[int]] | None,
    ) -> int | None:
        """Note the step's tokens (from the first stage of the step that carries the batch)
        and what this stage grew by; the step's tokens, or None when unknown."""
        if event.step is None:
            return None
        with self._lock:
            known = self._step_tokens.get(event.rank)
        if known is None or known[0] != event.step:
            counts = self._count_tokens(event)
            if counts is None:
                return None
            known = (event.step, counts)
            with self._lock:
                self._step_tokens[event.rank] = known
        tokens = known[1].tokens
        if event.error is None:
            growth: dict[str, int] = {}
            if host_begin is not None and host is not None:
                growth["host"] = host[1][0] - host_begin[0]
            if device_begin is not None and device is not None:
                growth["device"] = device[1][1] - device_begin[1]  # reserved: what the allocator holds
            with self._lock:
                self._forecaster.learn(event.rank, event.stage, tokens, growth)
        return tokens

    def _count_tokens(self, event: StageEnd) -> TokenCounts | None:
        try:
            for value in (event.inputs, event.result):
                counts = token_counts(value) if value is not None else None
                if counts is not None:
                    return counts
        except Exception as exc:
            if not self._token_failure_logged:
                self._token_failure_logged = True
                logger.warning(
                    "memory: could not count the tokens of stage %s's batch (%s: %s); the forecast skips such "
                    "batches, and later failures are not logged",
                    event.stage,
                    type(exc).__name__,
                    exc,
                )
        return None

    def _log(self, rank: int) -> int:
        """The rank's log, kept open for appending (one ``write`` per line, as append_line)."""
        with self._lock:
            pid, fd = self._logs.get(rank, (-1, -1))
            if pid != os.getpid():
                path = memory_log_path(self._root, rank)
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                self._logs[rank] = (os.getpid(), fd)
            return fd

    def close(self) -> None:
        with self._lock:
            for pid, fd in self._logs.values():
                if pid == os.getpid():
                    os.close(fd)
            self._logs.clear()
        self._gauge.close()
        self._cgroup.close()
        if self._history is not None:
            self._history.stop()
            self._history = None

    def _device_tracker(self) -> PeakTracker | None:
        # Looked up at the first stage, not at setup: torch (or torch_npu) may be imported later.
        if not self._device_checked:
            self._device_checked = True
            found = device_module()
            if found is not None:
                self._device_kind, module = found
                self._device = PeakTracker(DeviceGauge(module))
        return self._device

    def _device_figures(
        self, begin: list[int] | None, end: tuple[list[int], list[int]] | None
    ) -> dict[str, Any] | None:
        if self._device is None or end is None:
            return None
        now, peaks = end
        gauge = self._device.gauge
        assert isinstance(gauge, DeviceGauge)
        used, total = gauge.device_used()
        return {
            "kind": self._device_kind,
            "allocated_begin": begin[0] if begin else None,
            "allocated_end": now[0],
            "reserved_begin": begin[1] if begin else None,
            "reserved_end": now[1],
            "peak_allocated": peaks[0],
            "peak_reserved": peaks[1],
            "used": used,
            "total": total,
        }

    def _run_id(self) -> str:
        if self._run is None:
            self._run = run_id()
        return self._run


def _oom(error: BaseException | None) -> dict[str, Any] | None:
    """What an out-of-memory error says (:mod:`.oom`), or None for any other ending."""
    found = out_of_memory(f"{type(error).__name__}: {error}") if error is not None else None
    return None if found is None else {"device": found.device, "asked_bytes": found.asked_bytes}
