"""``verl-events mismatch --plot``: the pictures, drawn with matplotlib (msprobe installs it).

:func:`plot_summary`: ``|Δ log p|``'s quantiles over steps, and its mean and
largest value by response position over the run.  :func:`plot_layers`: each
layer's relative error, engine against trainer, with the tolerance.  Both
use matplotlib's file-only backend; a file that cannot be written is a
MismatchInputError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .layers import LayerProfile
from .summary import MismatchInputError, Summary

__all__ = ["plot_layers", "plot_summary"]

_QUANTILES = ("p50", "p90", "p99", "max")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display is needed, or opened
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MismatchInputError(f"--plot needs matplotlib ({exc}); pip install matplotlib") from None
    return plt


def _save(figure: Any, path: Path) -> None:
    try:
        figure.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise MismatchInputError(f"--plot {path}: cannot be written ({exc})") from None


def _positive(values: list[float | None]) -> list[float]:
    # A log axis cannot show 0: an exact match is drawn at the axis' floor instead of vanishing.
    floor = min((v for v in values if v), default=1e-12) / 10
    return [v if v else floor for v in (x if x is not None else 0.0 for x in values)]


def plot_summary(summary: Summary, path: Path) -> None:
    plt = _pyplot()
    figure, (over_steps, by_position) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    compared = [row for row in summary.steps if "log_prob" in row]
    ranks = sorted({row["rank"] for row in compared})
    for rank in ranks:
        rows = [row for row in compared if row["rank"] == rank]
        steps = [row["step"] for row in rows]
        for name in ("mean", *_QUANTILES):
            label = name if len(ranks) == 1 else f"{name}, rank {rank}"
            over_steps.plot(steps, _positive([row["log_prob"][name] for row in rows]), marker="o", label=label)
    over_steps.set(yscale="log", xlabel="step", ylabel="|Δ log p|", title="|Δ log p| over steps")
    over_steps.xaxis.get_major_locator().set_params(integer=True)
    over_steps.legend(fontsize="small")
    bins = summary.by_position
    starts = [row["start"] for row in bins]
    by_position.plot(starts, _positive([row["mean"] for row in bins]), marker="o", label="mean")
    by_position.plot(starts, _positive([row["max"] for row in bins]), marker="^", label="max")
    by_position.xaxis.get_major_locator().set_params(integer=True)
    by_position.set(yscale="log", xlabel="response position", ylabel="|Δ log p|", title="by response position")
    by_position.legend(fontsize="small")
    figure.suptitle(f"trainer old_log_probs vs rollout_log_probs: {summary.run.resolve().name}")
    _save(figure, path)
    plt.close(figure)


def plot_layers(profile: LayerProfile, path: Path) -> None:
    plt = _pyplot()
    layers = profile.layers
    figure, axis = plt.subplots(figsize=(max(6, 0.6 * len(layers) + 2), 4), layout="constrained")
    names = [layer.module for layer in layers]
    axis.bar(range(len(layers)), _positive([layer.error for layer in layers]), color="tab:blue")
    axis.axhline(profile.tolerance, color="tab:red", linestyle="--", label=f"tolerance {profile.tolerance:g}")
    axis.set_xticks(range(len(layers)), names, rotation=30, ha="right", fontsize="small")
    axis.set(
        yscale="log", ylabel="relative error of the output", title=f"engine prefill vs trainer, step {profile.step}"
    )
    axis.legend(fontsize="small")
    _save(figure, path)
    plt.close(figure)
