"""``verl-events mismatch --plot``: the pictures, drawn with matplotlib (msprobe installs it).

:func:`summary_figure`: ``|Δ log p|``'s quantiles over steps, and its mean and
largest value by response position over the run.  :func:`layers_figure`: each
layer's relative error, engine against trainer, as points on a log axis with
the tolerance; the layers the profile's table marks (where the error enters,
where it grows most) are ringed and labelled with the table's numbers.

Every legend sits outside its axes, so it covers no point.  The figures are
built without pyplot: no global backend, no display, nothing left open.
:func:`plot_summary` and :func:`plot_layers` write them to a file; one that
cannot be written is a MismatchInputError.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from .layers import LayerError, LayerProfile
from .summary import MismatchInputError, Summary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["ERROR_LABEL", "layers_figure", "plot_layers", "plot_summary", "summary_figure"]

#: The label of the layers figure's line of errors (tests find the line by it).
ERROR_LABEL = "relative error of the layer's output"
_QUANTILES = ("p50", "p90", "p99", "max")


def _figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MismatchInputError(f"--plot needs matplotlib ({exc}); pip install matplotlib") from None
    return Figure(figsize=(width, height), layout="constrained")


def _save(figure: Figure, path: Path) -> None:
    try:
        figure.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise MismatchInputError(f"--plot {path}: cannot be written ({exc})") from None


def _legend_outside(axis: Axes) -> None:
    # Right of the axes: inside them even loc="best" covers points once five lines cross.
    axis.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small", labelspacing=0.9)


def _positive(values: list[float | None]) -> list[float]:
    # A log axis cannot show 0: an exact match is drawn at the axis' floor instead of vanishing.
    floor = min((v for v in values if v), default=1e-12) / 10
    return [v if v else floor for v in (x if x is not None else 0.0 for x in values)]


# -- the run's |Δ log p| ------------------------------------------------------


def summary_figure(summary: Summary) -> Figure:
    """``|Δ log p|`` over steps (mean and quantiles, per rank) and by response position."""
    figure = _figure(12, 4)
    over_steps, by_position = figure.subplots(1, 2)
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
    _legend_outside(over_steps)
    bins = [row for row in summary.by_position if row["tokens"]]  # an empty bin has no value to draw
    starts = [row["start"] for row in bins]
    by_position.plot(starts, _positive([row["mean"] for row in bins]), marker="o", label="mean")
    by_position.plot(starts, _positive([row["max"] for row in bins]), marker="^", label="max")
    by_position.xaxis.get_major_locator().set_params(integer=True)
    by_position.set(yscale="log", xlabel="response position", ylabel="|Δ log p|", title="by response position")
    _legend_outside(by_position)
    figure.suptitle(f"trainer old_log_probs vs rollout_log_probs: {summary.run.resolve().name}")
    return figure


def plot_summary(summary: Summary, path: Path) -> None:
    _save(summary_figure(summary), path)


# -- the layer profile --------------------------------------------------------


def layers_figure(profile: LayerProfile) -> Figure:
    """Each layer's relative error as a point on a log axis, in the table's order, with the
    tolerance.  An exact 0 is drawn hollow at the bottom and a NaN or infinity as an X at the
    top, where a log axis could not place them.  The layer where the error enters and the one
    where it grows most (:attr:`LayerProfile.first_past`, :attr:`LayerProfile.grows_most`) are
    ringed and labelled with their error and growth."""
    layers = profile.layers
    errors = [layer.error for layer in layers]
    finite = [error for error in errors if 0 < error < math.inf]
    floor = min([*finite, profile.tolerance]) / 10
    ceiling = max([*finite, profile.tolerance]) * 10
    drawn = [error if 0 < error < math.inf else floor if error == 0 else ceiling for error in errors]
    places = list(range(len(layers)))

    figure = _figure(max(8.0, 0.7 * len(layers) + 5), 4.5)
    axis = figure.subplots()
    axis.plot(places, drawn, marker="o", color="tab:blue", label=ERROR_LABEL, zorder=3)
    zeros = [place for place in places if errors[place] == 0]
    if zeros:
        axis.plot(
            zeros,
            [floor] * len(zeros),
            "o",
            mfc="white",
            mec="tab:blue",
            zorder=4,
            label="exactly 0 (drawn at the bottom)",
        )
    broken = [place for place in places if not math.isfinite(errors[place])]
    if broken:
        axis.plot(
            broken,
            [ceiling] * len(broken),
            "X",
            color="black",
            ms=9,
            zorder=4,
            label="NaN or infinite (drawn at the top)",
        )
    axis.axhline(profile.tolerance, color="tab:red", linestyle="--", label=f"tolerance {profile.tolerance:g}")
    _mark(axis, profile, drawn)
    axis.set_xticks(places, [layer.module for layer in layers], rotation=30, ha="right", fontsize="small")
    axis.set_xlim(-0.6, len(layers) - 0.4)  # room beside the first and the last point for their labels
    # The tolerance always in view, and room above the highest point for its label.
    low, high = min([*drawn, profile.tolerance]) / 3, max([*drawn, profile.tolerance]) * 6
    axis.set(yscale="log", ylim=(low, high), ylabel="relative error ||engine - trainer|| / ||trainer||")
    axis.set_title(f"engine prefill vs trainer, step {profile.step}, rank {profile.rank}")
    _legend_outside(axis)
    return figure


def _ring(axis: Axes, place: int, value: float, shape: str, colour: str, label: str) -> None:
    """An open ``shape`` around the point at ``place``, in the legend as ``label``."""
    axis.plot([place], [value], shape, ms=13, mfc="none", mec=colour, mew=2, label=label)


def _mark(axis: Axes, profile: LayerProfile, drawn: list[float]) -> None:
    """Ring and label the layers the profile's table marks; one label when both are one layer."""
    labels: dict[int, list[str]] = {}
    first, grows = profile.first_past, profile.grows_most
    if first is not None:
        place = _place(profile.layers, first)
        value = f"{first.error:.3g}" if math.isfinite(first.error) else f"not finite ({first.error})"
        labels.setdefault(place, []).append(f"error enters: {value}")
        _ring(axis, place, drawn[place], "o", "tab:red", f"the error enters (first layer past {profile.tolerance:g})")
    if grows is not None and grows.growth is not None:
        place = _place(profile.layers, grows)
        labels.setdefault(place, []).append(f"grows most: x{grows.growth:.3g}")
        _ring(axis, place, drawn[place], "s", "tab:orange", "it grows most (error over the layer before's)")
    for place, texts in labels.items():
        axis.annotate(
            "\n".join(texts),
            xy=(place, drawn[place]),
            xytext=(0, 14),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize="small",
        )


def _place(layers: list[LayerError], layer: LayerError) -> int:
    return next(place for place, each in enumerate(layers) if each is layer)


def plot_layers(profile: LayerProfile, path: Path) -> None:
    _save(layers_figure(profile), path)
