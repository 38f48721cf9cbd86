"""The memory observer: how much memory each stage took, on the host and on the device.

Config::

    - name: memory
      record_history: false      # true: CUDA's allocator history, tagged by stage, and a snapshot
                                 # at an out-of-memory (see .history)
      history_entries: 100000    # the history's ring: the last this many allocator events
      forecast: true             # warn before a stage whose step's tokens predict more memory
                                 # than is left (see .forecast)
      peak: reset                # reset: the hooks reset and read the peaks, exact;
                                 # sampled: a thread does, every interval_s (see .sampler)
      interval_s: 0.05           # peak: sampled only

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

The peaks are process-wide.  With ``peak: reset`` they are reset when a
stage begins; nested and concurrent stages each keep theirs (:mod:`.peaks`).
With ``peak: sampled`` a thread resets and reads them every ``interval_s``,
and the hooks only note the stage (:mod:`.sampler` says what that blurs).
Passive.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import (
    ConfigError,
    InstallContext,
    Observer,
    StageEnd,
    StageEvent,
    Writes,
    prepare_output_dir,
    stage_header,
)
from verl_events.config import check_count
from verl_events.layout import run_id

from .cgroup import CgroupReader, find_cgroup
from .device import DeviceGauge, device_module
from .forecast import Forecast, Headroom, HostRoom, StepForecast, warn
from .history import History, cuda_oom_attacher
from .host import HostGauge
from .oom import out_of_memory
from .peaks import PeakTracker
from .record import MemoryRecord, memory_files, memory_log_path
from .sampler import Figures, Sampler

__all__ = ["MemoryObserver"]

logger = logging.getLogger("verl_events.memory")

#: ``peak: sampled``'s interval when none is given, and the range allowed.
DEFAULT_INTERVAL_S = 0.05
INTERVAL_RANGE_S = (0.001, 60.0)

Reading = tuple[list[int], list[int]]  # a gauge's (figures now, peaks), in its order


@dataclass(slots=True)
class _Ended:
    """What a stage's line needs, copied from its end event: the event itself holds the
    stage's result and inputs, which must not outlive it while ``peak: sampled`` waits."""

    seq: int
    step: int | None
    stage: str
    rank: int
    role: str | None
    error: BaseException | None
    host_begin: list[int] | None
    device_begin: list[int] | None
    tokens: int | None
    warned: list[Forecast] | None


class MemoryObserver(Observer):
    """Host, cgroup and device memory of every selected stage (see the module docstring)."""

    passive = True
    sees_driver = True  # the driver holds what generation returns
    sends_anomalies = True
    writes = Writes("memory log(s)", memory_files, "report", "verl_events.apps.report.command")

    def __init__(
        self,
        record_history: bool = False,
        history_entries: int = 100_000,
        forecast: bool = True,
        peak: str = "reset",
        interval_s: float | None = None,
    ) -> None:
        for name, value in (("record_history", record_history), ("forecast", forecast)):
            if not isinstance(value, bool):
                raise ConfigError(f"option {name}: {value!r} is not allowed; use true or false")
        if peak not in ("reset", "sampled"):
            raise ConfigError(f"option peak: {peak!r} is not allowed; use reset or sampled")
        if interval_s is not None and peak != "sampled":
            raise ConfigError(
                f"option interval_s: {interval_s!r} is not allowed with peak: reset; it is peak: sampled's"
            )
        low, high = INTERVAL_RANGE_S
        if interval_s is not None and (
            isinstance(interval_s, bool) or not isinstance(interval_s, int | float) or not low <= interval_s <= high
        ):
            raise ConfigError(
                f"option interval_s: {interval_s!r} is not allowed; use a number of seconds from {low} to {high:g}"
            )
        self.record_history = record_history
        self.history_entries = check_count(
            history_entries, "option history_entries", allowed="a number of allocator events >= 1", minimum=1
        )
        self.forecast = forecast
        self.wants_result = forecast  # the step's tokens are read from the stages' inputs and results
        self.peak = peak
        self.interval_s = float(interval_s if interval_s is not None else DEFAULT_INTERVAL_S)
        self._forecast = StepForecast()
        self._history: History | None = None
        self._root = Path()
        self._gauge = HostGauge()
        self._host = PeakTracker(self._gauge)
        self._sampler = (
            Sampler([self._gauge, None], self.interval_s, self._finish_sampled) if peak == "sampled" else None
        )
        self._logs: dict[int, tuple[int, int]] = {}  # rank -> (pid, descriptor) of its log
        self._device: PeakTracker | None = None
        self._device_kind: str | None = None
        self._device_checked = False
        self._cgroup = CgroupReader(None)
        self._room = HostRoom()
        self._lock = threading.Lock()
        self._begun: dict[int, tuple[list[int] | None, list[int] | None, list[Forecast] | None]] = {}
        self._run_id: Callable[[], str] = run_id  # until setup hands over the installation's
        self._warned_no_reset = False

    def setup(self, context: InstallContext) -> None:
        self._root, self._run_id = Path(context.save_path), context.run_id
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
        peak = f"sampled every {self.interval_s:g} s" if self._sampler is not None else "peak"
        history = (
            f"; CUDA allocator history ({self.history_entries} events) and a snapshot at an OOM"
            if self.record_history
            else ""
        )
        forecast = "; a warning before a stage whose step's tokens predict more than is left" if self.forecast else ""
        return f"host (resident, {peak}), cgroup and device memory of every selected stage{history}{forecast}"

    # -- the hooks ----------------------------------------------------------------

    def on_stage_begin(self, event: StageEvent) -> None:
        if self._history is not None:
            self._history.stage_begins(event.seq, event.stage, event.step, event.rank)
        device = self._device_tracker()
        if self._sampler is not None:
            self._sampler.begin(event.seq)  # the figures are the thread's
            host_begin = device_begin = None
        else:
            host_begin = self._host.begin(event.seq)
            device_begin = device.begin(event.seq) if device is not None else None
        warned = self._check_forecast(event) if self.forecast and event.step is not None else None
        if self._sampler is None or warned:
            with self._lock:
                self._begun[event.seq] = (host_begin, device_begin, warned)

    def on_stage_end(self, event: StageEnd) -> None:
        if self._history is not None:
            self._history.stage_ends(event.seq)
        with self._lock:
            host_begin, device_begin, warned = self._begun.pop(event.seq, (None, None, None))
        tokens = (
            self._forecast.step_tokens(event.stage, event.step, event.rank, event.inputs, event.result)
            if self.forecast
            else None
        )
        ended = _Ended(
            event.seq,
            event.step,
            event.stage,
            event.rank,
            event.role,
            event.error,
            host_begin,
            device_begin,
            tokens,
            warned,
        )
        if self._sampler is not None:
            self._sampler.end(event.seq, ended)
            return
        host = self._host.end(event.seq)
        device = self._device.end(event.seq) if self._device is not None else None
        self._finish(ended, host, device)

    def _finish_sampled(self, ended: _Ended, begin: Figures, end: Figures, peaks: Figures) -> None:
        """``peak: sampled``: a stage's line, on the sampling thread, from the samples around it
        (:mod:`.sampler`): the figures before it began and after it ended, and its peaks."""
        host = device = None
        ended.host_begin, ended.device_begin = begin[0], begin[1]
        if end[0] is not None:
            figures = [f[0] for f in (begin[0], end[0], peaks[0]) if f is not None]
            host = (end[0], [max(figures)])
        if end[1] is not None:
            device = (end[1], peaks[1] if peaks[1] is not None else end[1])
        try:
            self._finish(ended, host, device)
        except Exception:
            logger.exception("memory: could not write the line of stage %s (step %s)", ended.stage, ended.step)

    def _finish(self, ended: _Ended, host: Reading | None, device: Reading | None) -> None:
        """Learn what the stage grew by and write its line."""
        if ended.tokens is not None and ended.error is None:
            growth: dict[str, int] = {}
            if ended.host_begin is not None and host is not None:
                growth["host"] = host[1][0] - ended.host_begin[0]
            if ended.device_begin is not None and device is not None:
                growth["device"] = device[1][1] - ended.device_begin[1]  # reserved: what the allocator holds
            self._forecast.learn(ended.stage, ended.rank, ended.tokens, growth)
        resets = self._host.resets and (self._sampler is None or self._sampler.resets[0])
        if not resets and not self._warned_no_reset:
            self._warned_no_reset = True
            logger.warning(
                "memory: /proc/self/clear_refs cannot be written here: a stage's host peak is the larger of its "
                "begin and end figures, and a spike in between is missed"
            )
        cgroup = self._cgroup.read()
        record = MemoryRecord(
            **stage_header(ended, self._run_id),
            role=ended.role,
            pid=os.getpid(),
            error=type(ended.error).__name__ if ended.error is not None else None,
            host_begin_bytes=ended.host_begin[0] if ended.host_begin else None,
            host_peak_bytes=host[1][0] if host else None,
            host_end_bytes=host[0][0] if host else None,
            host_peak=("sampled" if self._sampler is not None else "reset") if resets else "begin_end",
            device_peak_bytes=device[1][0] if device else None,
            device=self._device_figures(ended.device_begin, device),
            oom=_oom(ended.error),
            tokens=ended.tokens,
            forecast=[found.to_dict() for found in ended.warned] if ended.warned else None,
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
        os.write(self._log(ended.rank), (record.to_json() + "\n").encode())

    # -- the forecast (.forecast) ----------------------------------------------

    def _check_forecast(self, event: StageEvent) -> list[Forecast] | None:
        """The warnings for this stage (logged and sent by :func:`.forecast.warn`), kept for its line."""
        assert event.step is not None
        found = self._forecast.check(event.stage, event.step, event.rank, self._host_room, self._device_room)
        warn(found, event.step, event.rank)
        return found or None

    def _host_room(self) -> Headroom | None:
        now = self._cgroup.read()
        return self._room.headroom(now.limit_bytes if now else None, now.usage_bytes if now else None)

    def _device_room(self) -> Headroom | None:
        gauge = self._device_gauge()
        if gauge is None:
            return None
        used, total = gauge.device_used()
        return Headroom(total - used, "device")

    # -- files, device, closing -----------------------------------------------------

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
        if self._sampler is not None:
            self._sampler.stop()  # the lines of the stages that ended since its last sample
        with self._lock:
            for pid, fd in self._logs.values():
                if pid == os.getpid():
                    os.close(fd)
            self._logs.clear()
        self._gauge.close()
        self._cgroup.close()
        self._room.close()
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
                if self._sampler is not None:
                    self._sampler.set_gauge(1, self._device.gauge)
        return self._device

    def _device_gauge(self) -> DeviceGauge | None:
        gauge = self._device.gauge if self._device is not None else None
        return gauge if isinstance(gauge, DeviceGauge) else None

    def _device_figures(self, begin: list[int] | None, end: Reading | None) -> dict[str, Any] | None:
        gauge = self._device_gauge()
        if gauge is None or end is None:
            return None
        now, peaks = end
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


def _oom(error: BaseException | None) -> dict[str, Any] | None:
    """What an out-of-memory error says (:mod:`.oom`), or None for any other ending."""
    found = out_of_memory(f"{type(error).__name__}: {error}") if error is not None else None
    return None if found is None else {"device": found.device, "asked_bytes": found.asked_bytes}
