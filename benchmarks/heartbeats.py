"""What the watchdog's heartbeats cost a save_path, and how fast the stuck and the dead are found.

    .venv/bin/python benchmarks/heartbeats.py     # --ranks 64,1024 --processes 2 --busy-s 12 --idle-s 12 --deaths 3

1. **File operations.**  ``--ranks`` simulated ranks share one save_path, split over
   ``--processes`` processes; each process sets up the real ``WatchdogObserver`` (its
   monitor thread, default ``heartbeat_s`` and ``liveness_s``) and calls its hooks with
   the ranks' stage events, so one monitor beats every rank of its process, as a process
   with several ranks would.  Busy phase: every rank runs verl's stages back to back,
   0.8 to 1.2 s each; idle phase: no stage begins or ends (nothing changes).  Each
   process counts the calls that touch a file under save_path (``io.open``,
   ``os.replace``, ``os.utime``, wrapped); a file opened to be written is an ``open``, a
   ``write`` and a ``close`` (``strace -f -c`` agrees), so the file syscalls are three
   per open plus the renames and the touches.  Measured over each phase's steady part
   (the busy phase after its first second, the idle phase after its first 2.5 s).
2. **The stuck and the dead**, as ``verl-events hangs`` reads them
   (:func:`~verl_events.apps.hangs.find_hangs`, :func:`~verl_events.apps.read.liveness.liveness`),
   polled every 50 ms while the simulated ranks stay idle: one more process, one more
   rank, begins a stage with ``timeout_s: 2`` and sleeps in it; **stuck** is how long
   after its deadline the reader names it.  Then, at a random point of its beat, the
   process is stopped (SIGSTOP: its heartbeat stops while its pid lives, exactly what a
   rank killed on another host looks like from here): **silent** is how long after that
   the reader calls it stopped; then SIGKILL: **gone** is how long until the reader sees
   the process gone (by pid, this host).  ``--deaths`` times.

Ends with one ``heartbeats_ranks=<N> ...`` line per rank count.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STAGES = (
    "rollout_generate",
    "compute_rm_score",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
    "update_weights",
)
POLL_S = 0.05


# -- one process of simulated ranks --------------------------------------------------


def count_file_calls(save_path: Path) -> dict[str, list[float]]:
    """Wrap ``io.open``, ``os.replace`` and ``os.utime``: the times of each call on a file under save_path."""
    root = str(save_path)
    calls: dict[str, list[float]] = {"open": [], "replace": [], "utime": []}

    def counted(kind: str, real: Any) -> Any:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(root):
                calls[kind].append(time.time())
            return real(path, *args, **kwargs)

        return call

    io.open = counted("open", io.open)  # type: ignore[assignment]  # pathlib's Path.open calls io.open
    os.replace = counted("replace", os.replace)  # type: ignore[assignment]
    os.utime = counted("utime", os.utime)
    return calls


def ranks_process(args: argparse.Namespace) -> None:
    save_path = Path(args.save_path)
    calls = count_file_calls(save_path)
    import verl_events
    from verl_events import StageEvent
    from verl_events.observers import WatchdogObserver

    first, last = (int(part) for part in args.block.split("-"))
    watchdog = WatchdogObserver()
    watchdog.name = "watchdog"
    watchdog.setup(verl_events.InstallContext(save_path, strict=False))
    start, busy_end = args.start, args.start + args.busy_s
    idle_end = busy_end + args.idle_s
    generator = random.Random(first)
    seq = 0
    # (when, rank, open event or None, when it began): the next thing each rank does
    plan: list[tuple[float, int, Any, float]] = [
        (start + generator.random(), rank, None, 0.0) for rank in range(first, last + 1)
    ]
    steps = dict.fromkeys(range(first, last + 1), 0)
    while plan:
        plan.sort(key=lambda item: item[0])
        when, rank, event, began_at = plan.pop(0)
        time.sleep(max(0.0, when - time.time()))
        if event is not None:
            watchdog.on_stage_end(event.ended(when - began_at, None))
            if when < busy_end - 1.2:
                plan.append((when + 0.005, rank, None, 0.0))
            continue
        seq += 1
        steps[rank] += 1
        stage = STAGES[steps[rank] % len(STAGES)]
        began = StageEvent(stage, "actor", steps[rank] // len(STAGES) + 1, rank, args.world, seq=seq)
        watchdog.on_stage_begin(began)
        plan.append((when + generator.uniform(0.8, 1.2), rank, began, when))
    time.sleep(max(0.0, idle_end - time.time()))
    windows = {"busy": (start + 1.0, busy_end), "idle": (busy_end + 2.5, idle_end)}
    counts = {
        phase: {kind: sum(low <= t < high for t in times) for kind, times in calls.items()}
        for phase, (low, high) in windows.items()
    }
    Path(args.out).write_text(json.dumps({"counts": counts, "windows": windows}))
    sys.stdin.read()  # the parent closes it once the readers are measured
    watchdog.close()


def victim_process(args: argparse.Namespace) -> None:
    """One rank that passes its deadline and then sleeps, until stopped and killed."""
    import verl_events
    from verl_events import StageEvent
    from verl_events.observers import WatchdogObserver

    watchdog = WatchdogObserver(timeout_s=2.0)
    watchdog.name = "watchdog"
    watchdog.setup(verl_events.InstallContext(Path(args.save_path), strict=False))
    watchdog.on_stage_begin(StageEvent("actor_update", "actor", 1, args.rank, args.world, seq=1))
    time.sleep(3600)


# -- the parent: the phases and the readers -------------------------------------------


def run_one(ranks: int, processes: int, busy_s: float, idle_s: float, deaths: int, root: Path) -> dict[str, Any]:
    from verl_events.apps.hangs import find_hangs
    from verl_events.apps.read.liveness import liveness, newest

    save_path = root / f"ranks{ranks}"
    save_path.mkdir()
    start = time.time() + 3.0
    size = -(-ranks // processes)
    workers = []
    for index in range(processes):
        first, last = index * size, min(ranks, (index + 1) * size) - 1
        out = root / f"ranks{ranks}.{index}.json"
        command = [sys.executable, __file__, "--ranks-process", "--save-path", str(save_path)]
        command += ["--block", f"{first}-{last}", "--world", str(ranks + 1), "--start", repr(start)]
        command += ["--busy-s", str(busy_s), "--idle-s", str(idle_s), "--out", str(out)]
        workers.append((subprocess.Popen(command, stdin=subprocess.PIPE), out))
    for _, out in workers:
        while not out.exists():
            time.sleep(0.2)
    totals: dict[str, dict[str, int]] = {}
    for _, out in workers:
        for phase, kinds in json.loads(out.read_text())["counts"].items():
            for kind, count in kinds.items():
                totals.setdefault(phase, {}).setdefault(kind, 0)
                totals[phase][kind] += count
    seconds = {"busy": busy_s - 1.0, "idle": idle_s - 2.5}
    rates = {}
    for phase, kinds in totals.items():
        syscalls = 3 * kinds["open"] + kinds["replace"] + kinds["utime"]
        rates[phase] = {
            "rewrites_s": kinds["replace"] / seconds[phase],
            "touches_s": kinds["utime"] / seconds[phase],
            "syscalls_s": syscalls / seconds[phase],
            "namespace_ops_s": (kinds["open"] + kinds["replace"]) / seconds[phase],
            "per_rank_s": syscalls / seconds[phase] / ranks,
        }
    stuck, silent, gone, reads = [], [], [], []
    for _ in range(deaths):
        victim = subprocess.Popen(
            [sys.executable, __file__, "--victim", "--save-path", str(save_path), "--rank", str(ranks)]
            + ["--world", str(ranks + 1)],
            stderr=subprocess.DEVNULL,  # its warning that the deadline passed
        )
        while True:  # stuck: the reader names the victim's stage after its deadline
            began = time.time()
            result = find_hangs(save_path)
            reads.append(time.time() - began)
            mine = [record for record in result.hangs if record.pid == victim.pid]
            if mine:
                stuck.append(time.time() - (mine[0].began + mine[0].deadline_s))
                break
            time.sleep(POLL_S)
        time.sleep(random.uniform(0.0, 2.5))
        for signal_number, kind, found in ((signal.SIGSTOP, "silent", silent), (signal.SIGKILL, "gone", gone)):
            os.kill(victim.pid, signal_number)
            sent = time.time()
            while True:
                result = find_hangs(save_path)
                beats = result.heartbeats
                (beat,) = [b for b in beats if b.rank == ranks]
                if liveness(beat, time.time(), newest(beats)).state == kind:
                    found.append(time.time() - sent)
                    break
                if time.time() - sent > 120:
                    raise RuntimeError(f"the reader did not call the victim {kind} within 120 s")
                time.sleep(POLL_S)
        victim.wait()
    for worker, _ in workers:
        assert worker.stdin is not None
        worker.stdin.close()
        worker.wait()
    return {"rates": rates, "stuck": stuck, "silent": silent, "gone": gone, "read_s": statistics.median(reads)}


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="64,1024")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--busy-s", type=float, default=12.0)
    parser.add_argument("--idle-s", type=float, default=12.0)
    parser.add_argument("--deaths", type=int, default=3)
    # the child processes
    parser.add_argument("--ranks-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--victim", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--save-path", help=argparse.SUPPRESS)
    parser.add_argument("--block", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ranks_process:
        return ranks_process(args)
    if args.victim:
        return victim_process(args)
    lines = []
    with tempfile.TemporaryDirectory() as folder:
        for ranks in (int(n) for n in args.ranks.split(",")):
            got = run_one(ranks, args.processes, args.busy_s, args.idle_s, args.deaths, Path(folder))
            print(f"{ranks} ranks in {args.processes} processes:")
            for phase, rate in got["rates"].items():
                print(
                    f"  {phase}: {rate['syscalls_s']:.0f} file syscalls/s ({rate['per_rank_s']:.2f} a rank), "
                    f"{rate['rewrites_s']:.0f} rewrites/s, {rate['touches_s']:.0f} touches/s, "
                    f"{rate['namespace_ops_s']:.0f} creates + renames/s"
                )
            print(f"  found after the event (min / median / max of {args.deaths}; one read of every heartbeat:")
            print(f"  {got['read_s'] * 1000:.0f} ms, polled every {POLL_S * 1000:.0f} ms):")
            print(f"    stuck (after its deadline): {spread(got['stuck'])}")
            print(f"    dead on another host (silent, after SIGSTOP): {spread(got['silent'])}")
            print(f"    dead on this host (gone, after SIGKILL): {spread(got['gone'])}")
            busy, idle = got["rates"]["busy"], got["rates"]["idle"]
            lines.append(
                f"heartbeats_ranks={ranks} busy_syscalls_s={busy['syscalls_s']:.0f} "
                f"idle_syscalls_s={idle['syscalls_s']:.0f} idle_per_rank_s={idle['per_rank_s']:.3f} "
                f"stuck_s={max(got['stuck']):.2f} silent_s={max(got['silent']):.2f} gone_s={max(got['gone']):.2f}"
            )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
