"""How each reader's time and memory grow with ranks and steps (part 1 of issue #29).

    python benchmarks/scale.py [--ranks 4,16] [--steps 20] [--commands diagnose,hangs,report,triage,weights]
                               [--keep DIR [--reuse]] [--timeout 900] [--memory-limit-gib 20]

For each point (ranks x steps) it writes a synthetic run of every rank x step x the 8
stages of a verl step, in the observers' own formats, each line made by its format's owner
(the record classes and writers each observer's format owner defines): every
rank's timing log and memory log, the weight-sync ledger, the sentinel's anomalies, the
watchdog's heartbeats, hang records and hang reports, a crash record and a process's end,
and ``run.json``.  A failure is planted at rank R (three quarters of the way through the
ranks) and the last step S:

* step S-1: rank R's ``actor_update`` gives a NaN grad norm (the sentinel's first anomaly;
  every other rank's follows, the norm being all-reduced), and rank R's weight sync sends
  NaN (the ledger's one alarm);
* step S: rank R raises in ``compute_values``; every other rank finishes it and waits in
  ``critic_update``'s all_reduce past its deadline (a hang record and report each), its
  process still beating: their heartbeats' mtimes are set to the present before each reader
  runs, as those ranks' watchdogs keep doing (the liveness beat).

Each reader then runs as a user runs it, ``verl-events COMMAND RUN --json``, in a
subprocess of its own, one at a time, under a memory limit (RLIMIT_AS) and a time limit.
A row per (ranks, steps, command): wall time, peak resident memory (the child's
``ru_maxrss``, from ``wait4``), the run's records and bytes on disk, and whether the
output names the planted failure (``NOT FOUND`` and what it said otherwise).  Then, per
command, how time and memory grew from one point to the next against the records.

Without ``--keep`` each run is written to a temporary folder and removed once measured;
with ``--keep DIR`` it stays in ``DIR/r{N}_s{S}``, and ``--reuse`` takes a run already
there with the same parameters instead of writing it again.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from verl_events import STAGE_ROLES
from verl_events.layout import RUN_ID_ENV, claim_save_path
from verl_events.observers.memory import record as memory_record
from verl_events.observers.sentinel import record as anomaly_record
from verl_events.observers.timing import TimingRecord, timing_log_path
from verl_events.observers.watchdog import crash as crash_record
from verl_events.observers.watchdog import record as hang_record
from verl_events.observers.weight_sync import record as weight_sync_record

# What each stage takes on a rank (s): a PPO step of about 80 s.
STAGE_SECONDS = {
    "rollout_generate": 38.0,
    "ref_compute_log_prob": 4.0,
    "actor_compute_log_prob": 5.0,
    "compute_values": 5.0,
    "critic_update": 9.0,
    "compute_rm_score": 3.0,
    "actor_update": 12.0,
    weight_sync_record.STAGE: 2.0,
}
STAGES = tuple(stage for stage in STAGE_ROLES if stage in STAGE_SECONDS)  # in verl's order
FAILED, HUNG, ANOMALOUS = "compute_values", "critic_update", "actor_update"
ERROR, MESSAGE = "RuntimeError", "CUDA error: an illegal memory access was encountered"
OBSERVERS = ("timing", "watchdog", "memory", "sentinel", "weight_sync")
HOOK_SECONDS = {"timing": 2e-6, "watchdog": 1.5e-5, "memory": 8e-5, "sentinel": 3e-5, "weight_sync": 4e-6}
GPUS_PER_NODE = 8
LIVENESS_S = 2.0
HUNG_FOR_S = 600.0  # how long the survivors have waited when the readers run
COMMANDS = ("diagnose", "hangs", "report", "triage", "weights")
GIB, MIB = 2**30, 2**20
BYTES_PER_RECORD = 900  # a little above what a run holds a line, for the disk check


@dataclass(frozen=True)
class Plan:
    """One synthetic run: its size, the rank that fails at the last step, and its clock."""

    ranks: int
    steps: int
    run_id: str
    start: float  # Unix time step 1 began

    @property
    def bad_rank(self) -> int:
        return self.ranks * 3 // 4

    def begin(self, step: int, stage: str) -> float:
        """When ``stage`` of ``step`` began (every rank at once: each waits for the slowest)."""
        offset = 0.0
        for name in STAGES:
            if name == stage:
                break
            offset += STAGE_SECONDS[name] * 1.15
        return self.start + (step - 1) * STEP_S + offset

    def host(self, rank: int) -> str:
        return f"node{rank // GPUS_PER_NODE:04d}"

    def pid(self, rank: int) -> int:
        return 40_000 + rank % GPUS_PER_NODE

    def deadline(self) -> float:
        """The watchdog's adaptive deadline of the hung stage: 3 x its longest time."""
        return round(3 * STAGE_SECONDS[HUNG] * 1.1, 3)


STEP_S = sum(STAGE_SECONDS.values()) * 1.15


def new_plan(ranks: int, steps: int) -> Plan:
    return Plan(ranks, steps, f"scale-r{ranks}-s{steps}", time.time() - HUNG_FOR_S - steps * STEP_S)


# -- the run, written through each format's owner ---------------------------------------


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat().replace("+00:00", "Z")


def write_rank(run: Path, plan: Plan, rank: int) -> int:
    """Rank ``rank``'s timing log and memory log; the number of lines."""
    rng = random.Random(rank)
    role_of, pid, run_id = STAGE_ROLES, plan.pid(rank), plan.run_id
    resident = 6 * GIB + rng.randrange(GIB // 4)
    allocated = 20 * GIB + rng.randrange(GIB)
    cgroup = {"version": 2, "path": f"/sys/fs/cgroup/kubepods/pod-{plan.host(rank)}", "limit_bytes": 1536 * GIB}
    timing, memory = [], []
    for step in range(1, plan.steps + 1):
        tokens = 2_000_000 + rng.randrange(500_000)
        for stage in STAGES:
            last = step == plan.steps
            if last and rank != plan.bad_rank and stage == HUNG:
                break  # waits in its all_reduce: the stage never ends
            raised = last and rank == plan.bad_rank and stage == FAILED
            base = STAGE_SECONDS[stage]
            elapsed = base * (0.7 if raised else rng.uniform(0.9, 1.1))
            spread = rng.uniform(0.8, 1.25)
            hooks = {name: seconds * spread for name, seconds in HOOK_SECONDS.items()}
            halves = {name: seconds / 2 for name, seconds in hooks.items()}
            end = plan.begin(step, stage) + elapsed + 1e-4
            timing.append(
                TimingRecord(
                    run=run_id,
                    stage=stage,
                    role=role_of[stage],
                    step=step,
                    rank=rank,
                    world_size=plan.ranks,
                    elapsed_s=elapsed,
                    error=ERROR if raised else None,
                    message=MESSAGE if raised else None,
                    observers=OBSERVERS,
                    profiled=False,
                    hook_s=hooks,
                    hook_begin_s=halves,
                    hook_end_s=halves,
                    overhead_s=sum(hooks.values()) - hooks["timing"],
                    end_unix=end,
                    timestamp=_iso(end),
                ).to_json()
            )
            grown = rng.randrange(64 * MIB)
            peak_allocated = allocated + rng.randrange(8 * GIB)
            memory.append(
                memory_record.MemoryRecord(
                    run=run_id,
                    step=step,
                    stage=stage,
                    rank=rank,
                    role=role_of[stage],
                    time=end,
                    pid=pid,
                    error=ERROR if raised else None,
                    host_begin_bytes=resident,
                    host_peak_bytes=resident + grown,
                    host_end_bytes=resident + rng.randrange(2 * MIB),
                    host_peak="reset",
                    device_peak_bytes=peak_allocated,
                    device={
                        "kind": "cuda",
                        "allocated_begin": allocated,
                        "allocated_end": allocated,
                        "reserved_begin": allocated + 4 * GIB,
                        "reserved_end": allocated + 4 * GIB,
                        "peak_allocated": peak_allocated,
                        "peak_reserved": peak_allocated + 2 * GIB,
                        "used": allocated + 6 * GIB,
                        "total": 80 * GIB,
                    },
                    cgroup={**cgroup, "usage_bytes": (resident + grown) * GPUS_PER_NODE, "oom_kills": 0},
                    tokens=tokens,
                ).to_json()
            )
            if raised:
                break
    for path, lines in ((timing_log_path(run, rank), timing), (memory_record.memory_log_path(run, rank), memory)):
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(timing) + len(memory)


NAN_TENSORS = ["model.layers.11.mlp.down_proj.weight", "model.layers.11.mlp.up_proj.weight"]
NAN_SAID = "2 tensor(s) hold NaN or infinite values"


def write_ledger(run: Path, plan: Plan) -> int:
    """The weight-sync ledger: one line a sync and rank, every step but the last (it fails
    before its sync), rank R's sync of step S-1 sending NaN; the number of lines."""
    tensors, size = 290, 15_231_000_000
    receipt = {"tensors": tensors + 1, "compared": tensors, "same_dtype": True}
    bad = plan.bad_rank
    lines = []
    for step in range(1, plan.steps):
        began = plan.begin(step, weight_sync_record.STAGE)
        for rank in range(plan.ranks):
            nan = (step, rank) == (plan.steps - 1, bad)
            nonfinite = NAN_TENSORS if nan else []
            alarms = [weight_sync_record.Alarm("nonfinite", nonfinite, len(nonfinite), "model.layers.11", NAN_SAID)]
            record = weight_sync_record.SyncRecord(
                run=plan.run_id,
                step=step,
                rank=rank,
                time=began + 1.8 + rank * 1e-4,
                complete=True,
                tensors=tensors,
                bytes=size,
                adapter=False,
                adapter_tensors=0,
                changed=None if step == 1 else tensors,
                unchanged=[],
                optimizer_stepped=True,
                nonfinite=nonfinite,
                receipt={**receipt, "missing": [], "differs": [], "not_updated": []},
                canary={"max": 3.1e-07, "mean": 4.2e-08, "layers": [1.1e-07, 2.3e-07], "tolerance": 0.001},
                alarms=alarms if nan else [],
                seconds={"manifest": 0.41, "receipt": 0.52, "canary": 0.08},
            )
            lines.append(record.to_json())
    weight_sync_record.weight_sync_log_path(run).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def write_anomalies(run: Path, plan: Plan) -> int:
    """Step S-1's NaN grad norm: rank R's first, then every other rank's."""
    step, bad = plan.steps - 1, plan.bad_rank
    at = plan.begin(step, ANOMALOUS) + STAGE_SECONDS[ANOMALOUS]
    lines = []
    for rank in [bad, *(r for r in range(plan.ranks) if r != bad)]:
        record = anomaly_record.AnomalyRecord(
            step=step,
            stage=ANOMALOUS,
            rank=rank,
            metric="actor/grad_norm",
            value=math.nan,
            rule="non_finite",
            detail="actor/grad_norm is nan",
            run=plan.run_id,
            time=at + (0 if rank == bad else 0.05 + rank * 1e-4),
        )
        lines.append(record.to_json())
    anomaly_record.anomaly_log_path(run).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def _ended(plan: Plan, stage: str, step: int) -> dict[str, Any]:
    return {"step": step, "time": plan.begin(step, stage) + STAGE_SECONDS[stage]}


def write_heartbeats(run: Path, plan: Plan) -> int:
    """Every rank's last heartbeat: rank R's closed after its exception, the others' written
    when their deadline passed inside the hung stage (:func:`beat` keeps them beating)."""
    last, bad = plan.steps, plan.bad_rank
    for rank in range(plan.ranks):
        stop = FAILED if rank == bad else HUNG
        done = STAGES[: STAGES.index(stop) + (rank == bad)]
        ended = {stage: _ended(plan, stage, last if stage in done else last - 1) for stage in STAGES}
        before = STAGES[STAGES.index(stop) - 1]
        began = plan.begin(last, stop) + rank * 1e-4
        common = {
            "run": plan.run_id,
            "rank": rank,
            "pid": plan.pid(rank),
            "host": plan.host(rank),
            "begun": (last - 1) * len(STAGES) + STAGES.index(stop) + 1,
            "last_begun": {"stage": stop, "step": last, "time": began},
            "ended": ended,
            "liveness_s": LIVENESS_S,
            "started": plan.start - 30.0,
            "mtime_beats": True,
        }
        if rank == bad:
            beat = hang_record.Heartbeat(
                **common,
                time=_failed_at(plan) + 0.2,
                last_ended={"stage": stop, **ended[stop]},
                closed=True,
                exit={"how": "exception", "detail": f"{ERROR}: {MESSAGE}"},
            )
        else:
            opened = {"stage": stop, "step": last, "since": began, "begun": common["begun"], "thread": "MainThread"}
            passed = {"thread_id": 139_861_331_236_672, "deadline_s": plan.deadline(), "passed": True}
            beat = hang_record.Heartbeat(
                **common,
                time=began + plan.deadline() + 0.5,
                open=[opened | passed],
                last_ended={"stage": before, **ended[before]},
            )
        hang_record.write_heartbeat(run, beat)
    return plan.ranks


def beat(run: Path, plan: Plan, now: float) -> None:
    """The hung ranks' liveness beats as of ``now`` (each within the last beat), as their
    watchdogs keep beating while their processes wait."""
    rng = random.Random(plan.ranks)
    for rank in range(plan.ranks):
        if rank != plan.bad_rank:
            hang_record.touch_heartbeat(run, rank, now - rng.uniform(0.0, LIVENESS_S * 0.75))


def _failed_at(plan: Plan) -> float:
    return plan.begin(plan.steps, FAILED) + STAGE_SECONDS[FAILED] * 0.7


def write_watchdog(run: Path, plan: Plan) -> int:
    """Rank R's crash record and process end; every other rank's hang record and report."""
    last, bad, deadline = plan.steps, plan.bad_rank, plan.deadline()
    where = {"file": "/opt/verl/verl/workers/critic/dp_critic.py", "line": 241, "function": "update_critic"}
    crashed = crash_record.crash_log_path(run, bad)
    crashed.parent.mkdir(parents=True, exist_ok=True)
    failed_at = _failed_at(plan)
    traceback = (
        'Traceback (most recent call last):\n  File "/opt/verl/verl/workers/critic/dp_critic.py", line 188, in '
        f"compute_values\n    values = self._forward_micro_batch(micro_batch)\n{ERROR}: {MESSAGE}\n"
    )
    record = crash_record.CrashRecord(
        kind="exception",
        run=plan.run_id,
        time=failed_at,
        rank=bad,
        pid=plan.pid(bad),
        host=plan.host(bad),
        step=last,
        stage=FAILED,
        role=STAGE_ROLES[FAILED],
        error_type=ERROR,
        message=MESSAGE,
        where={**where, "line": 188, "function": "compute_values", "code": "values = self._forward_micro_batch(mb)"},
        traceback=traceback,
    )
    crashed.write_text(record.to_json() + "\n", encoding="utf-8")
    end = crash_record.ProcessEnd(
        run=plan.run_id,
        time=failed_at + 0.2,
        pid=plan.pid(bad),
        host=plan.host(bad),
        ranks=[bad],
        how="exception",
        detail=f"{ERROR}: {MESSAGE}",
    )
    crash_record.ends_log_path(run).write_text(end.to_json() + "\n", encoding="utf-8")
    hang_record.report_dir(run).mkdir(parents=True, exist_ok=True)
    lines = []
    for rank in range(plan.ranks):
        if rank == bad:
            continue
        began = plan.begin(last, HUNG) + rank * 1e-4
        report = hang_record.new_report_path(run, last, HUNG, rank)
        report.write_text(_hang_report(rank, where), encoding="utf-8")
        hang = hang_record.HangRecord(
            kind="hang",
            run=plan.run_id,
            time=began + deadline + 0.5,
            step=last,
            stage=HUNG,
            role=STAGE_ROLES[HUNG],
            rank=rank,
            pid=plan.pid(rank),
            host=plan.host(rank),
            thread="MainThread",
            began=began,
            begun=(last - 1) * len(STAGES) + STAGES.index(HUNG) + 1,
            elapsed_s=round(deadline + 0.5, 3),
            deadline_s=deadline,
            deadline="adaptive",
            where={**where, "code": "dist.all_reduce(loss)"},
            waiting_in="torch.distributed.all_reduce",
            collective="not recorded: set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 to turn on NCCL's flight recorder",
            report=report.relative_to(run).as_posix(),
        )
        lines.append(hang.to_json())
    hang_record.hangs_log_path(run).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines) + 2


def _hang_report(rank: int, where: dict[str, Any]) -> str:
    frames = "\n".join(f"   File '/opt/verl/verl/module{i}.py', line {100 + i}, in call{i}" for i in range(30))
    return (
        f"rank {rank}: stage {HUNG!r} passed its deadline\n"
        f"thread MainThread:\n{frames}\n>> File {where['file']!r}, line {where['line']}, in {where['function']}\n"
        "   File '/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py', line 2501, in all_reduce\n"
    )


def write_run(run: Path, plan: Plan) -> int:
    """The whole run (see the module docstring); the number of records (lines and heartbeats)."""
    os.environ[RUN_ID_ENV] = plan.run_id  # the run every line names, and run.json's
    claim_save_path(run, [])
    for folder in (timing_log_path(run, 0).parent, memory_record.memory_log_path(run, 0).parent):
        folder.mkdir(parents=True, exist_ok=True)
    hang_record.heartbeat_dir(run).mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        ledger = pool.submit(write_ledger, run, plan)
        ranks = pool.map(write_rank, [run] * plan.ranks, [plan] * plan.ranks, range(plan.ranks), chunksize=8)
        records = sum(ranks) + ledger.result()
    records += write_anomalies(run, plan) + write_watchdog(run, plan)
    return records + write_heartbeats(run, plan)


def disk_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        total += sum(os.stat(os.path.join(root, name)).st_size for name in files)
    return total


# -- what each reader should name -----------------------------------------------------


def _diagnose(out: Path, plan: Plan) -> str | None:
    first = json.loads(out.read_bytes()).get("first") or {}
    said = (first.get("rank"), first.get("step"), first.get("stage"), first.get("kind"))
    return None if said == (plan.bad_rank, plan.steps, FAILED, "exception") else f"first failure {said}"


def _hangs(out: Path, plan: Plan) -> str | None:
    result = json.loads(out.read_bytes())
    stuck, suspects = result.get("stuck"), (result.get("suspect") or {}).get("ranks")
    expected = ({"step": plan.steps, "stage": HUNG}, [plan.bad_rank])
    return None if (stuck, suspects) == expected else f"stuck {stuck}, suspects {suspects}"


def _report(out: Path, plan: Plan) -> str | None:
    raised = [(r["stage"], r["ranks"], r["steps"]) for r in json.loads(out.read_bytes()).get("raised", [])]
    return None if raised == [(FAILED, [plan.bad_rank], [plan.steps])] else f"raised {raised}"


def _triage(out: Path, plan: Plan) -> str | None:
    anomaly = json.loads(out.read_bytes()).get("anomaly") or {}
    said = (anomaly.get("rank"), anomaly.get("step"), anomaly.get("stage"))
    return None if said == (plan.bad_rank, plan.steps - 1, ANOMALOUS) else f"first anomaly {said}"


def _weights(out: Path, plan: Plan) -> str | None:
    """The syncs with an alarm, read from the output without loading it whole (it holds every
    sync of the run: about a GB at 1,024 ranks x 1,000 steps)."""
    with out.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as text:
        said = [(sync["step"], sync["rank"], [a["kind"] for a in sync["alarms"]]) for sync in _alarmed(text)]
    return None if said == [(plan.steps - 1, plan.bad_rank, ["nonfinite"])] else f"alarms {said[:5]}"


def _alarmed(text: mmap.mmap) -> Iterator[dict[str, Any]]:
    # json.dumps(indent=1) writes an empty list as [] and the syncs at two spaces' indent.
    at = text.find(b'"alarms": [\n')
    while at >= 0:
        begin, end = text.rfind(b"\n  {\n", 0, at), text.find(b"\n  }", at)
        yield json.loads(text[begin : end + 4])
        at = text.find(b'"alarms": [\n', end)


FINDERS: dict[str, Callable[[Path, Plan], str | None]] = {
    "diagnose": _diagnose,
    "hangs": _hangs,
    "report": _report,
    "triage": _triage,
    "weights": _weights,
}


# -- each reader, timed in a subprocess of its own ------------------------------------


@dataclass(frozen=True)
class Row:
    ranks: int
    steps: int
    command: str
    seconds: float
    peak_mib: float
    records: int
    bytes: int
    status: str  # "ok", "over N s", "over the limit, exit N", "exit N"
    missed: str | None  # what the output said instead of the planted failure; None: it named it


def verl_events_exe() -> str:
    exe = shutil.which("verl-events", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("verl-events is not installed beside this interpreter: pip install -e . first")
    return exe


def time_reader(
    command: str, run: Path, plan: Plan, scratch: Path, timeout_s: float, limit_bytes: int
) -> tuple[float, float, str, str | None]:
    """Run ``verl-events COMMAND RUN --json``: (seconds, peak MiB, status, what it missed)."""
    out, err = scratch / f"{command}.out", scratch / f"{command}.err"

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    timed_out = threading.Event()

    def stop(pid: int) -> None:
        timed_out.set()
        try:
            os.kill(pid, signal.SIGKILL)  # not reaped yet (wait4 below has not returned): still our child
        except ProcessLookupError:
            pass

    with out.open("wb") as stdout, err.open("wb") as stderr:
        started = time.perf_counter()
        argv = [verl_events_exe(), command, str(run), "--json"]
        child = subprocess.Popen(argv, stdout=stdout, stderr=stderr, preexec_fn=limited)
        timer = threading.Timer(timeout_s, stop, (child.pid,))
        timer.start()
        try:
            _, wait_status, usage = os.wait4(child.pid, 0)  # the child's own rusage, not a running max
        finally:
            timer.cancel()
        seconds = time.perf_counter() - started
    child.returncode = code = os.waitstatus_to_exitcode(wait_status)
    peak = usage.ru_maxrss / 1024  # KiB on Linux
    said = err.read_text(errors="replace")
    if timed_out.is_set():
        return seconds, peak, f"over {timeout_s:g} s", "not read: stopped"
    # At the limit Python raises MemoryError, or a C extension whose allocation failed crashes (SIGSEGV).
    out_of_memory = any(words in said for words in ("MemoryError", "Cannot allocate memory", "bad_alloc"))
    if out_of_memory or (code not in (0, 1) and peak * MIB >= 0.9 * limit_bytes):
        return seconds, peak, f"over the limit, exit {code}", "not read: out of memory"
    if code not in (0, 1):
        return seconds, peak, f"exit {code}", (said.strip().splitlines() or ["no error output"])[-1]
    try:
        return seconds, peak, "ok", FINDERS[command](out, plan)
    except (ValueError, KeyError, TypeError) as exc:
        return seconds, peak, "ok", f"unreadable output ({exc})"


# -- the points, the table ----------------------------------------------------------


def prepared_run(root: Path, ranks: int, steps: int, reuse: bool) -> tuple[Path, Plan, int, float]:
    """The run of one point under ``root`` (written, or reused): (folder, plan, records, seconds to write)."""
    run, marker = root / f"r{ranks}_s{steps}", root / f"r{ranks}_s{steps}.json"
    if reuse and marker.exists() and run.is_dir():
        saved = json.loads(marker.read_text())
        return run, Plan(**saved["plan"]), saved["records"], 0.0
    if run.exists():
        shutil.rmtree(run)
    marker.unlink(missing_ok=True)
    need = ranks * steps * len(STAGES) * 2 * BYTES_PER_RECORD
    free = shutil.disk_usage(root).free
    if need > free * 0.9:
        raise SystemExit(f"{ranks} ranks x {steps} steps needs about {need / GIB:.1f} GiB; {root} has {free / GIB:.1f}")
    plan = new_plan(ranks, steps)
    started = time.perf_counter()
    records = write_run(run, plan)
    seconds = time.perf_counter() - started
    marker.write_text(json.dumps({"plan": asdict(plan), "records": records}))
    return run, plan, records, seconds


def measure_point(root: Path, ranks: int, steps: int, args: argparse.Namespace) -> list[Row]:
    run, plan, records, wrote_s = prepared_run(root, ranks, steps, args.reuse)
    size = disk_bytes(run)
    how = f"written in {wrote_s:.0f} s" if wrote_s else "reused"
    planted = f"planted: rank {plan.bad_rank} raises at step {steps}"
    print(f"# {ranks} ranks x {steps} steps: {records:,} records, {size / GIB:.2f} GiB ({how}); {planted}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="scale_out_") as scratch:
        for command in args.commands:
            beat(run, plan, time.time())
            seconds, peak, status, missed = time_reader(
                command, run, plan, Path(scratch), args.timeout, int(args.memory_limit_gib * GIB)
            )
            rows.append(Row(ranks, steps, command, seconds, peak, records, size, status, missed))
            print(_row(rows[-1]), flush=True)
    return rows


HEADER = f"{'ranks':>6} {'steps':>6} {'command':<9} {'time s':>8} {'peak MiB':>9} {'records':>12} {'GiB':>7}  names it"


def _row(row: Row) -> str:
    named = "yes" if row.missed is None else f"NOT FOUND: {row.missed}"
    status = "" if row.status == "ok" else f" ({row.status})"
    return (
        f"{row.ranks:>6} {row.steps:>6} {row.command:<9} {row.seconds:>8.2f} {row.peak_mib:>9.0f} "
        f"{row.records:>12,} {row.bytes / GIB:>7.2f}  {named}{status}"
    )


def growth(rows: list[Row]) -> list[str]:
    """Per command, time and memory from each point to the next, against the records."""
    lines = []
    for command in dict.fromkeys(row.command for row in rows):
        mine = sorted((r for r in rows if r.command == command), key=lambda r: r.records)
        for small, big in zip(mine, mine[1:], strict=False):
            points = f"{command:<9} {small.ranks}x{small.steps} -> {big.ranks}x{big.steps}: "
            points += f"records x{big.records / small.records:.1f}, "
            if small.status != "ok" or big.status != "ok":
                lines.append(points + f"not comparable ({small.status}; {big.status})")
                continue
            lines.append(
                points + f"time x{big.seconds / small.seconds:.1f}, peak memory x{big.peak_mib / small.peak_mib:.1f}"
            )
    return lines


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=_numbers, default=[4, 16], help="rank counts, comma-separated (4,16)")
    parser.add_argument("--steps", type=_numbers, default=[20], help="step counts, comma-separated (20)")
    parser.add_argument("--commands", type=lambda t: t.split(","), default=list(COMMANDS), help=",".join(COMMANDS))
    parser.add_argument("--keep", type=Path, help="write the runs here and leave them (default: a temporary folder)")
    parser.add_argument("--reuse", action="store_true", help="with --keep: take a run already there")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a reader may run (900)")
    parser.add_argument("--memory-limit-gib", type=float, default=20.0, help="a reader's address space (20 GiB)")
    args = parser.parse_args()
    unknown = [c for c in args.commands if c not in COMMANDS]
    if unknown or min(args.steps) < 2:
        parser.error(f"--commands takes {', '.join(COMMANDS)}; --steps at least 2 (got {unknown}, {args.steps})")
    rows: list[Row] = []
    print(HEADER, flush=True)
    for steps in args.steps:
        for ranks in args.ranks:
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                rows += measure_point(args.keep, ranks, steps, args)
                continue
            with tempfile.TemporaryDirectory(prefix="scale_run_") as root:
                rows += measure_point(Path(root), ranks, steps, args)
    print("\n" + HEADER)
    print("\n".join(_row(row) for row in rows))
    if len(rows) > len(args.commands):
        print("\n" + "\n".join(growth(rows)))
    missed = [row for row in rows if row.missed is not None]
    if missed:
        where = "; ".join(f"{r.command} at {r.ranks}x{r.steps}" for r in missed)
        print(f"\nNOT FOUND by {len(missed)} reader run(s): {where}")


if __name__ == "__main__":
    main()
