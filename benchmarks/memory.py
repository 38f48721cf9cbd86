"""What the memory observer's hooks cost a stage.

    python benchmarks/memory.py [--stages 20000]

Times an empty stage with nothing installed and with the ``memory`` observer (host and
cgroup figures; no device here), and prints the difference per stage: the hooks' cost,
which is reading ``/proc/self/status`` twice, resetting the peak once (``clear_refs``),
reading the cgroup's files and appending one JSON line.  The best of 5 rounds.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import verl_events
from verl_events import stage


def per_stage(stages: int) -> float:
    started = time.perf_counter()
    for step in range(stages):
        with stage("actor_update", role="actor", step=step):
            pass
    return (time.perf_counter() - started) / stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=20_000)
    args = parser.parse_args()
    bare = min(per_stage(args.stages) for _ in range(5))
    with tempfile.TemporaryDirectory() as folder:
        with verl_events.install({"save_path": folder, "observers": [{"name": "memory"}]}):
            watched = min(per_stage(args.stages // 10) for _ in range(5))
    print(f"empty stage, nothing installed: {bare * 1e6:.1f} µs")
    print(f"with the memory observer:       {watched * 1e6:.1f} µs")
    print(f"memory_hooks_us_per_stage={(watched - bare) * 1e6:.1f}")


if __name__ == "__main__":
    main()
