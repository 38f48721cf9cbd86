"""How `verl-events report` scales with ranks.

    python benchmarks/report_scale.py [--ranks 1 10 100 1000] [--steps 100]

Writes synthetic timing logs (the timing observer's records, every field
set as it sets them) for each rank count x steps x 6 stages, with msprobe on steps 1-2, then times the report
(reading every rank's log, grouping, the overhead table and the JSON
output) on each.  The last line prints seconds per million records (wall clock; and
the process's CPU time, which a loaded machine inflates less) and the
ratio of the largest to the second-largest run's time per record scaled by
their sizes (about 10 for 1000 vs 100 ranks means linear).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tempfile
import time
from pathlib import Path

from rich.console import Console

from verl_events.apps.report import report
from verl_events.observers.timing import TimingRecord

STAGES = (
    "rollout_generate",
    "ref_compute_log_prob",
    "actor_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
)


def write_run(root: Path, ranks: int, steps: int) -> int:
    (root / "timing").mkdir(parents=True)
    rng = random.Random(ranks)
    now = time.time()
    for rank in range(ranks):
        lines = []
        for step in range(1, steps + 1):
            for stage in STAGES:
                dumped = step <= 2 and stage != "rollout_generate"
                hooks = {"timing": 2e-5, **({"msprobe": 0.02} if dumped else {})}
                elapsed = rng.uniform(0.5, 1.5) * (3.0 if dumped else 1.0)
                lines.append(
                    TimingRecord(
                        run="report-scale",
                        stage=stage,
                        role="actor",
                        step=step,
                        rank=rank,
                        world_size=ranks,
                        depth=0,
                        parent=None,
                        elapsed_s=elapsed,
                        error=None,
                        observers=tuple(hooks),
                        profiled=dumped,
                        profiled_by=("msprobe",) if dumped else (),
                        enclosed_by=(),
                        hook_s=hooks,
                        hook_begin_s={k: v / 2 for k, v in hooks.items()},
                        hook_end_s={k: v / 2 for k, v in hooks.items()},
                        overhead_s=hooks.get("msprobe", 0.0),
                        end_unix=now - (steps - step) * 10,  # a finished run: every stage in the past
                        dump_bytes=60_000 if dumped else 0,
                        timestamp="2026-11-29T19:00:00Z",
                    ).to_json()
                )
        (root / "timing" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return ranks * steps * len(STAGES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--engine", choices=("auto", "records", "duckdb"), default="auto", help="the report's engine")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="report_scale_") as scratch:
        for ranks in args.ranks:
            run = Path(scratch) / f"ranks{ranks}"
            records = write_run(run, ranks, args.steps)
            started, cpu = time.perf_counter(), time.process_time()
            text = report(run, console=Console(file=io.StringIO()), as_json_output=True, quiet=True, engine=args.engine)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            assert text is not None and json.loads(text)["records"] == records
            results.append((ranks, records, seconds, cpu))
            print(
                f"ranks={ranks:<5} records={records:<8} report_s={seconds:7.3f}  "
                f"us/record={seconds / records * 1e6:6.2f}  cpu_s={cpu:7.3f}"
            )
    (r_big, n_big, s_big, cpu_big), (r_small, n_small, s_small, _) = results[-1], results[-2]
    per_million = s_big / n_big * 1e6
    print(
        f"seconds_per_million_records={per_million:.2f} ratio_{r_big}_vs_{r_small}_ranks={s_big / s_small:.1f} "
        f"(records x{n_big / n_small:.0f}) cpu_seconds_per_million_records={cpu_big / n_big * 1e6:.2f}"
    )


if __name__ == "__main__":
    main()
