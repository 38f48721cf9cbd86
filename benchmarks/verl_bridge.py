"""verl_events' bridge against verl's own precision_debugger tool, on one worker and model.

    python benchmarks/verl_bridge.py [--iters 20] [--rounds 2]

1. Dumping: the same verl worker (real DistProfilerExtension, real
   @DistProfiler.annotate(role="actor_update")) runs ``update_actor`` on the
   same MLP, each call a profiled step (``start_profile(profile_step=N)``,
   the stage, ``stop_profile()``), with msprobe statistics L1 either
   through our bridge and msprobe observer or through verl's own
   ``precision_debugger`` tool.  Each mode runs in its own processes
   (msprobe's debugger is one per process), alternating, ``--rounds`` times;
   the figure is the median of the per-call medians.  Target ratio <= 1.02.
2. Disabled path: ns per call of the annotated method with profiling off,
   plain verl vs with our bridge installed and nothing listening.

The last line: ``dump_ratio=<ours/verl> bridged_disabled_overhead_ns=<bridged - plain>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

MODES = ("verl", "ours", "ours_keep_api_hooks")
# The packaged statistics_L1 config (verl's guide's dump_config.json).
CONFIGS = Path(__file__).resolve().parents[1] / "verl_events/observers/msprobe/configs"
STATS_L1 = json.loads((CONFIGS / "statistics_L1.json").read_text(encoding="utf-8"))


def make_worker(profiler: Any) -> Any:
    import torch
    from verl.utils.profiler import DistProfiler, DistProfilerExtension

    class Worker(DistProfilerExtension):  # type: ignore[misc]
        def __init__(self) -> None:
            torch.manual_seed(0)
            layers: list[torch.nn.Module] = []
            for _ in range(6):
                layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
            self.actor_module = torch.nn.Sequential(*layers)
            self.optimizer = torch.optim.SGD(self.actor_module.parameters(), lr=1e-3)
            self.data = torch.randn(64, 256)
            DistProfilerExtension.__init__(self, profiler)

        @DistProfiler.annotate(color="red", role="actor_update")
        def update_actor(self, data: Any = None) -> float:
            loss = self.actor_module(self.data).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            return float(loss.detach())

    return Worker()


def run_mode(mode: str, iters: int, root: Path) -> list[float]:
    """One process's timings (seconds per profiled update_actor, warm-up excluded)."""
    from verl.utils.profiler import DistProfiler, ProfilerConfig
    from verl.utils.profiler.config import PrecisionDebuggerToolConfig

    config_path = root / "stats_l1.json"
    config_path.write_text(json.dumps(STATS_L1))
    if mode == "verl":
        tool = PrecisionDebuggerToolConfig(config_path=str(config_path), stages=["actor_update"])
        config = ProfilerConfig(tool="precision_debugger", enable=True, save_path=str(root / "out"), tool_config=tool)
        worker = make_worker(DistProfiler(rank=0, config=config, tool_config=tool))
    else:
        import verl_events
        from verl_events.verl_bridge import install_verl_bridge

        install_verl_bridge()
        verl_events.install(
            {
                "save_path": str(root / "out"),
                "observers": [
                    {
                        "name": "msprobe",
                        "config_path": str(config_path),
                        "stages": ["actor_update"],
                        "keep_api_hooks": mode == "ours_keep_api_hooks",
                    }
                ],
            }
        )
        worker = make_worker(DistProfiler(rank=0, config=None))
    times = []
    for step in range(1, iters + 4):
        worker.start_profile(role="train", profile_step=step)
        started = time.perf_counter()
        worker.update_actor()
        times.append(time.perf_counter() - started)
        worker.stop_profile()
    dumps = list((root / "out").rglob("dump.json"))
    assert len(dumps) == iters + 3, f"{mode}: expected {iters + 3} dumps, found {len(dumps)}"
    return times[3:]


def disabled_path_ns(number: int = 100_000) -> tuple[float, float]:
    """ns per call of an annotated method with profiling off: plain verl, then bridged."""
    from verl.utils.profiler import DistProfiler, DistProfilerExtension

    from verl_events.verl_bridge import install_verl_bridge, uninstall_verl_bridge

    class Worker(DistProfilerExtension):  # type: ignore[misc]
        def __init__(self) -> None:
            DistProfilerExtension.__init__(self, DistProfiler(rank=0, config=None))

        @DistProfiler.annotate(color="red", role="actor_update")
        def update_actor(self) -> None:
            return None

    worker = Worker()
    plain = min(timeit.repeat(worker.update_actor, number=number, repeat=7)) / number * 1e9
    install_verl_bridge()  # wraps Worker.update_actor in place
    try:
        bridged = min(timeit.repeat(worker.update_actor, number=number, repeat=7)) / number * 1e9
    finally:
        uninstall_verl_bridge()
    return plain, bridged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        with tempfile.TemporaryDirectory(prefix="bridge_bench_") as scratch:
            print(json.dumps(run_mode(args.mode, args.iters, Path(scratch))))
        return
    medians: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            out = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--iters", str(args.iters)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            medians[mode].append(statistics.median(json.loads(out.strip().splitlines()[-1])))
    summary = {mode: statistics.median(values) for mode, values in medians.items()}
    plain_ns, bridged_ns = disabled_path_ns()
    for mode, label in (
        ("verl", "verl precision_debugger"),
        ("ours", "verl_events bridge"),
        ("ours_keep_api_hooks", "verl_events, keep_api_hooks"),
    ):
        runs = [round(m * 1e3, 2) for m in medians[mode]]
        print(f"dumped update_actor, {label:<28} {summary[mode] * 1e3:8.2f} ms (per-process medians {runs})")
    print(f"annotated method, profiling off, plain verl:   {plain_ns:8.0f} ns/call")
    print(f"annotated method, profiling off, bridged:      {bridged_ns:8.0f} ns/call")
    print(
        f"dump_ratio={summary['ours'] / summary['verl']:.3f} "
        f"dump_ratio_keep_api_hooks={summary['ours_keep_api_hooks'] / summary['verl']:.3f} "
        f"bridged_disabled_overhead_ns={bridged_ns - plain_ns:.0f}"
    )


if __name__ == "__main__":
    main()
