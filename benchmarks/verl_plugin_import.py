"""What our verl plugin costs at ``import verl`` when ``VERL_EVENTS_CONFIG`` is unset.

    python benchmarks/verl_plugin_import.py [--runs 10]

verl imports every ``verl.plugins`` entry point at ``import verl`` (``VERL_USE_EXTERNAL_PLUGINS``,
default ``auto``); ours then only reads the variable. Each run is a fresh interpreter that
times ``import verl`` (perf_counter around the import, interpreter start-up excluded), in
three variants, alternating ``--runs`` times:

- ``plugin``: verl's default: entry points discovered, ours imported;
- ``discover``: ``VERL_USE_EXTERNAL_PLUGINS=<no such name>``: entry points discovered, none imported;
- ``none``: ``VERL_USE_EXTERNAL_PLUGINS=none``: no discovery at all.

``plugin - discover`` is our module's import; ``discover - none`` is verl's own discovery,
which any installed plugin brings. Both are far below the run-to-run spread of a 2 s import,
so the discover and none runs also time our module's import alone, right after ``import verl``.
The last line: ``plugin_import_overhead_ms=<median of the paired differences plugin - none>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = """
import importlib, json, sys, time
started = time.perf_counter()
import verl
result = {"s": time.perf_counter() - started, "plugin": "verl_events.verl_plugin" in sys.modules}
if not result["plugin"]:  # what the plugin variant adds, timed alone: our module, verl already imported
    started = time.perf_counter()
    importlib.import_module("verl_events.verl_plugin")
    result["module_s"] = time.perf_counter() - started
print(json.dumps(result))
"""
VARIANTS = {"plugin": None, "discover": "no_such_plugin", "none": "none"}
UNSET = ("VERL_EVENTS_CONFIG", "VERL_USE_EXTERNAL_PLUGINS", "VERL_USE_EXTERNAL_MODULES")


def import_once(policy: str | None) -> tuple[float, float, float | None]:
    """Seconds of ``import verl`` in a fresh interpreter, the whole process's wall seconds, and
    (where verl did not import our plugin) seconds to import it afterwards."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    if policy is not None:
        env["VERL_USE_EXTERNAL_PLUGINS"] = policy
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - started
    result = json.loads(out.strip().splitlines()[-1])
    if result["plugin"] != (policy is None):
        sys.exit(f"VERL_USE_EXTERNAL_PLUGINS={policy!r}: verl_events.verl_plugin imported: {result['plugin']}")
    return float(result["s"]), wall, result.get("module_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    imports: dict[str, list[float]] = {name: [] for name in VARIANTS}
    walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
    module: list[float] = []
    import_once(None)  # warm the file cache
    for _ in range(args.runs):
        for name, policy in VARIANTS.items():
            seconds, wall, module_s = import_once(policy)
            imports[name].append(seconds)
            walls[name].append(wall)
            module += [] if module_s is None else [module_s]
    for name in VARIANTS:
        ms = sorted(round(s * 1e3) for s in imports[name])
        print(
            f"import verl, {name:<8} median {statistics.median(imports[name]) * 1e3:7.1f} ms "
            f"(min {ms[0]}, max {ms[-1]}); whole process {statistics.median(walls[name]) * 1e3:7.1f} ms"
        )

    def paired_ms(a: str, b: str) -> float:
        return statistics.median(x - y for x, y in zip(imports[a], imports[b], strict=True)) * 1e3

    print(
        f"paired differences: plugin - discover {paired_ms('plugin', 'discover'):+.1f} ms (our module), "
        f"discover - none {paired_ms('discover', 'none'):+.1f} ms (verl's discovery)"
    )
    print(
        f"verl_events.verl_plugin imported after verl: median {statistics.median(module) * 1e3:.2f} ms "
        f"(max {max(module) * 1e3:.2f})"
    )
    print(f"plugin_import_overhead_ms={paired_ms('plugin', 'none'):.1f}")


if __name__ == "__main__":
    main()
