"""``verl-events report --plot``: the overhead table as a figure (needs matplotlib).

The figure says what the table says: each profiled bar carries its ratio, marked ``*`` when
either median is of too few records, with the table's footnote; the disk panel is drawn only
when something was profiled (a run without profiling dumped nothing, and an empty panel's
axis would run below zero).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..read.overhead import TRUSTED_MIN_N, StageOverhead, TimingLogError

__all__ = ["INSTALL_HINT", "overhead_figure", "ratio_label", "write_plot"]

#: How to get matplotlib: verl-events installs from a checkout (it is not on PyPI).
INSTALL_HINT = "pip install matplotlib (or, in a checkout of verl-events, pip install -e '.[plot]')"
#: The table's footnote for a mark, in the figure's words.
TOO_FEW = f"* a median of fewer than {TRUSTED_MIN_N} records (a ratio: on either side): too few to trust"


def ratio_label(row: StageOverhead) -> str | None:
    """The ratio as the overhead table prints it (``17.94x*``), or None without one."""
    if row.ratio is None:
        return None
    return f"{row.ratio:.2f}x{'*' if row.ratio_too_few else ''}"


def overhead_figure(overhead: list[StageOverhead]) -> Any:
    """A matplotlib Figure of ``overhead``: stage time unprofiled vs profiled (median, with the
    spread as error bars) and each ratio over its profiled bar; below it, when any row was
    profiled, the dump MB per profiled step.  Built without pyplot, so nothing global is touched."""
    try:
        import matplotlib  # noqa: F401  (first: a submodule may be imported already, matplotlib itself gone)
        from matplotlib.figure import Figure
    except ImportError:
        raise TimingLogError(f"--plot needs matplotlib: {INSTALL_HINT}") from None

    profiled = any(row.profiled_n for row in overhead)
    fig = Figure(figsize=(max(8, len(overhead) * 1.3), 8 if profiled else 5))
    axes = fig.subplots(2 if profiled else 1, 1, sharex=True, squeeze=False)[:, 0]
    times = axes[0]
    x = list(range(len(overhead)))
    base = [(r.unprofiled_s, r.unprofiled_low_s, r.unprofiled_high_s) for r in overhead]
    cost = [(r.profiled_s, r.profiled_low_s, r.profiled_high_s) for r in overhead]
    for offset, figures, label in ((-0.2, base, "unprofiled"), (0.2, cost, "profiled")):
        heights = [(median or 0) * 1e3 for median, _, _ in figures]
        below = [(median - low) * 1e3 if median is not None and low is not None else 0 for median, low, _ in figures]
        above = [(high - median) * 1e3 if median is not None and high is not None else 0 for median, _, high in figures]
        times.bar([i + offset for i in x], heights, 0.4, yerr=[below, above], capsize=3, label=f"{label} (median)")
    for i, row in enumerate(overhead):
        ratio = ratio_label(row)
        if ratio is not None and row.profiled_s is not None:
            top = (row.profiled_high_s or row.profiled_s) * 1e3
            times.annotate(ratio, (i + 0.2, top), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=8)
    times.set_ylabel("ms per stage")
    times.set_yscale("symlog")
    times.legend()
    times.set_title("Stage time, profiled vs baseline (bars: IQR, or min-max below 4; labels: ratio)")
    if any(row.ratio_too_few or row.unprofiled_too_few or row.profiled_too_few for row in overhead):
        fig.text(0.01, 0.005, TOO_FEW, fontsize=8, ha="left", va="bottom")
    if profiled:
        disk = axes[1]
        mb = [r.dump_bytes_per_step / 1e6 if r.profiled_n else 0.0 for r in overhead]
        disk.bar(x, mb, 0.6, color="tab:green")
        disk.set_ylim(0, max(mb) * 1.1 or 1.0)  # nothing dumped: an axis from 0, not one around it
        disk.set_ylabel("dump MB per profiled step")
    labels = [f"{row.stage}\n{'+'.join(row.profiled_by) or '-'}" for row in overhead]
    axes[-1].set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def write_plot(overhead: list[StageOverhead], path: Path) -> None:
    """:func:`overhead_figure` written as a PNG to ``path``."""
    overhead_figure(overhead).savefig(path, dpi=100)
