"""``verl-events report --memory-plot``: each stage's memory over the steps, as a figure.

The figure of the memory table (:mod:`.memory`), step by step, from the same
records (the memory observer's, of stages that did not raise, read by
:func:`.memory.read_memory`):

* **host**: per stage, its host peak (solid) and its host figure when it
  began (dashed), each the largest rank's at that step: the process's trend;
* **rise**: per stage, its peak less its begin (the largest rank's): what the
  stage itself took on top of what the process held;
* **device**: per stage, its device peak, when the records carry one.

One line per stage, in the table's order; a stage the table flags as a leak
is drawn thicker and named so in the legend.  Records without a step (a stage
run outside verl's training steps) have no place on the step axis and are
left out.  :func:`memory_lines` builds the figure's data with the standard
library only; :func:`memory_figure` needs matplotlib and imports it when
called.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events.observers.memory import record as memory_record

from .memory import read_memory, stage_memory
from .plot import INSTALL_HINT
from .summary import ReportError

__all__ = [
    "MEMORY_PLOT",
    "SUFFIXES",
    "StageMemoryLine",
    "check_figure_path",
    "memory_figure",
    "memory_lines",
    "run_memory_figure",
    "write_figure",
]

#: The option that asks for the figure, as its errors name it.
MEMORY_PLOT = "--memory-plot"
#: The files matplotlib writes the figure as, by the name's suffix.
SUFFIXES = (".png", ".svg", ".pdf")
_MB = 2**20


@dataclass(frozen=True, slots=True)
class StageMemoryLine:
    """One stage's figures, one per step it ran in (the largest rank's at that step), in MB.

    ``host_begin_mb`` is None at a step whose records lack the begin figure, and so is
    ``host_rise_mb``; ``device_peak_mb`` is None where no device was recorded."""

    stage: str
    steps: tuple[int, ...]
    host_peak_mb: tuple[float, ...]
    host_begin_mb: tuple[float | None, ...]
    host_rise_mb: tuple[float | None, ...]
    device_peak_mb: tuple[float | None, ...]
    leak: bool
    kept_median_mb: float


def memory_lines(records: list[Any], stage_order: list[str]) -> list[StageMemoryLine]:
    """One line per stage with a step, in the memory table's order, leaks flagged as it flags them."""
    by_stage: dict[str, dict[int, list[Any]]] = {}
    for record in records:
        if record.error is None and record.host_peak_bytes is not None and record.step is not None:
            by_stage.setdefault(record.stage, {}).setdefault(record.step, []).append(record)
    return [
        _line(row.stage, by_stage[row.stage], row.leak, row.kept_median_mb)
        for row in stage_memory(records, stage_order)
        if row.stage in by_stage
    ]


def _line(stage: str, by_step: dict[int, list[Any]], leak: bool, kept_median_mb: float) -> StageMemoryLine:
    steps = tuple(sorted(by_step))
    return StageMemoryLine(
        stage=stage,
        steps=steps,
        host_peak_mb=tuple(max(r.host_peak_bytes for r in by_step[s]) / _MB for s in steps),
        host_begin_mb=tuple(_largest(r.host_begin_bytes for r in by_step[s]) for s in steps),
        host_rise_mb=tuple(
            _largest(None if r.host_begin_bytes is None else r.host_peak_bytes - r.host_begin_bytes for r in by_step[s])
            for s in steps
        ),
        device_peak_mb=tuple(_largest(r.device_peak_bytes for r in by_step[s]) for s in steps),
        leak=leak,
        kept_median_mb=kept_median_mb,
    )


def _largest(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) / _MB if known else None


def check_figure_path(path: Path) -> None:
    """ReportError unless ``path`` names a file of a format the figure is written in."""
    if path.suffix.lower() not in SUFFIXES:
        given = f"a {path.suffix} file" if path.suffix else "a name without a suffix"
        allowed = f"{', '.join(SUFFIXES[:-1])} or {SUFFIXES[-1]}"
        raise ReportError(f"{MEMORY_PLOT} {path}: {given} is not allowed; the figure is written as {allowed}")


def run_memory_figure(run: Path, stage_order: list[str]) -> Any:
    """The figure of ``run``'s memory records; ReportError when it has none to draw."""
    lines = memory_lines(read_memory(run, []), stage_order)  # a bad line: the report warns of it
    if not lines:
        raise ReportError(
            f"{MEMORY_PLOT}: {run} has no memory records of a step to draw "
            f"({run / memory_record.MEMORY_DIR}/rank*.jsonl, stages with a step that did not raise); "
            "record the run with the memory observer (name: memory)"
        )
    return memory_figure(lines)


def memory_figure(lines: list[StageMemoryLine]) -> Any:
    """A matplotlib Figure of ``lines`` (see the module docstring).  Built without pyplot, so
    nothing global is touched; ReportError naming the install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401  (first: a submodule may be imported already, matplotlib itself gone)
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
    except ImportError:
        raise ReportError(f"{MEMORY_PLOT} needs matplotlib: {INSTALL_HINT}") from None

    device = any(mb is not None for line in lines for mb in line.device_peak_mb)
    fig = Figure(figsize=(10, 8 if device else 6), layout="constrained")
    axes = fig.subplots(3 if device else 2, 1, sharex=True, squeeze=False)[:, 0]
    host, rise = axes[0], axes[1]
    colours = [f"C{i % 10}" for i in range(len(lines))]
    for line, colour in zip(lines, colours, strict=True):
        width = 3.0 if line.leak else 1.5
        label = line.stage + (f" - leak: keeps {line.kept_median_mb:+.1f} MB a step" if line.leak else "")
        host.plot(line.steps, line.host_peak_mb, color=colour, linewidth=width, marker="o", markersize=3, label=label)
        host.plot(line.steps, _gaps(line.host_begin_mb), color=colour, linewidth=width * 0.7, linestyle="--")
        rise.plot(line.steps, _gaps(line.host_rise_mb), color=colour, linewidth=width, marker="o", markersize=3)
        if device:
            axes[2].plot(
                line.steps, _gaps(line.device_peak_mb), color=colour, linewidth=width, marker="o", markersize=3
            )
        if line.leak:
            host.annotate(
                "leak",
                (line.steps[-1], line.host_peak_mb[-1]),
                xytext=(4, 0),
                textcoords="offset points",
                color=colour,
                fontsize=8,
                va="center",
            )
    host.set_title("Memory by stage and step (largest rank at each step)")
    host.set_ylabel("host MB (resident)")
    rise.set_ylabel("host MB: peak - begin")
    rise.set_ylim(bottom=min(0.0, *(mb for line in lines for mb in line.host_rise_mb if mb is not None)))
    if device:
        axes[2].set_ylabel("device peak MB")
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.get_major_locator().set_params(integer=True)
    stage_handles, _ = host.get_legend_handles_labels()
    kinds = [
        Line2D([], [], color="black", linewidth=1.5, marker="o", markersize=3, label="peak"),
        Line2D([], [], color="black", linewidth=1.0, linestyle="--", label="begin"),
    ]
    # Beside the panels, not over them: a legend inside would cover the lines it names.
    fig.legend(handles=stage_handles + kinds, loc="outside right upper", fontsize=8)
    return fig


def _gaps(values: tuple[float | None, ...]) -> list[float]:
    """``values`` with NaN for None: matplotlib leaves a gap there."""
    return [float("nan") if v is None else v for v in values]


def write_figure(figure: Any, path: Path) -> None:
    """``figure`` written to ``path`` (its folders made); ReportError naming the option if it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=80)
    except OSError as exc:
        raise ReportError(f"{MEMORY_PLOT} {path}: the figure cannot be written there ({exc.strerror or exc})") from exc
