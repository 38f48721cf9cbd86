"""``verl-events mismatch --plot``'s pictures, read back from their matplotlib figures.

Each figure is checked against the data behind it: the summary's quantiles from a real
mismatch observer's log (two ranks, real torch), the layer profile's points and marks from
two real msprobe tensor dumps of a small model (tests/test_mismatch.py's), the marks against
the layers the profile's own table marks.  No legend may cover a plotted point, in display
coordinates after matplotlib's layout.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")
pytest.importorskip("verl")
pytest.importorskip("msprobe")

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Annotation

import verl_events
from verl_events import stage
from verl_events.apps.mismatch.command import render_layers
from verl_events.apps.mismatch.layers import LayerProfile, layer_profile
from verl_events.apps.mismatch.plot import ERROR_LABEL, layers_figure, summary_figure
from verl_events.apps.mismatch.summary import Summary, summarize

from .mismatch_models import Tiny, dump_both_sides, random_gap

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")


def drawn_points(axis: Axes) -> list[tuple[Line2D, list[tuple[float, float]]]]:
    """Each line with markers, and its points in display coordinates."""
    return [
        (line, [tuple(point) for point in axis.transData.transform(line.get_xydata())])
        for line in axis.get_lines()
        if line.get_marker() not in ("None", "", None)
    ]


def assert_no_legend_covers_a_point(figure: Figure) -> None:
    figure.draw_without_rendering()  # the layout: legends and axes where the file has them
    for axis in figure.axes:
        legend = axis.get_legend()
        assert legend is not None, axis.get_title()
        box, frame = legend.get_window_extent(), axis.get_window_extent()
        for line, points in drawn_points(axis):
            covered = [point for point in points if box.contains(*point)]
            assert not covered, f"{axis.get_title()}: the legend covers {line.get_label()} at {covered}"
            hidden = [point for point in points if not frame.contains(*point)]
            assert not hidden, f"{axis.get_title()}: {line.get_label()} is drawn outside the axes at {hidden}"


def line(axis: Axes, label: str) -> Line2D:
    (found,) = [each for each in axis.get_lines() if each.get_label() == label]
    return found


# -- the summary ----------------------------------------------------------------


@pytest.fixture
def two_ranks(tmp_path: Path) -> Summary:
    """Three steps on two ranks, the gap growing each step; no response token at the last
    position, so its position bin is empty."""
    save_path = tmp_path / "run"
    mask = torch.tensor([[1, 1, 1, 0]] * 3)
    with verl_events.install({"save_path": str(save_path), "observers": [{"name": "mismatch"}]}):
        for step in (1, 2, 3):
            for rank in (0, 1):
                old, rollout = random_gap(seed=10 * step + rank)
                old = rollout + (old - rollout) * 2**step
                inputs = {"rollout_log_probs": rollout, "response_mask": mask}
                call = stage("actor_compute_log_prob", step=step, rank=rank, inputs=inputs)
                with call:
                    call.set_result({"old_log_probs": old})
    return summarize(save_path)


def test_the_summary_draws_each_ranks_quantiles_over_steps_on_a_log_axis(two_ranks: Summary) -> None:
    over_steps, _ = summary_figure(two_ranks).axes
    assert over_steps.get_yscale() == "log"
    for rank in (0, 1):
        rows = [row for row in two_ranks.steps if row["rank"] == rank]
        for name in ("mean", "p50", "p90", "p99", "max"):
            drawn = line(over_steps, f"{name}, rank {rank}")
            assert list(drawn.get_xdata()) == [1, 2, 3]
            assert list(drawn.get_ydata()) == [row["log_prob"][name] for row in rows]


def test_the_summary_draws_the_filled_position_bins_only(two_ranks: Summary) -> None:
    _, by_position = summary_figure(two_ranks).axes
    assert [row["tokens"] for row in two_ranks.by_position] == [18, 18, 18, 0]
    filled = two_ranks.by_position[:3]
    for name in ("mean", "max"):
        drawn = line(by_position, name)
        assert list(drawn.get_xdata()) == [row["start"] for row in filled]
        assert list(drawn.get_ydata()) == [row[name] for row in filled]


def test_the_summarys_legends_cover_no_point(two_ranks: Summary) -> None:
    assert_no_legend_covers_a_point(summary_figure(two_ranks))


# -- the layer profile -------------------------------------------------------------


def profile_of(tmp_path: Path, engine: Tiny, trainer: Tiny) -> LayerProfile:
    dump_both_sides(tmp_path, engine, trainer)
    return layer_profile(tmp_path, 1)


@pytest.fixture
def trainer_model() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def marked_in_table(profile: LayerProfile) -> dict[str, list[str]]:
    """The table's marked layers (``render_layers``): module -> its marks."""
    marked: dict[str, list[str]] = {}
    for text in render_layers(profile).splitlines():
        if "<- " in text:
            module, marks = text.split("<- ", 1)
            marked[module.split()[0]] = [mark.strip(", ") for mark in marks.split("<- ")]
    return marked


def labels(axis: Axes) -> dict[str, tuple[tuple[float, float], str]]:
    """Each annotation, by the module under its x: where it points and what it says."""
    names = [tick.get_text() for tick in axis.get_xticklabels()]
    return {names[round(text.xy[0])]: (text.xy, text.get_text()) for text in axis.texts if isinstance(text, Annotation)}


def test_a_bfloat16_engines_layers_are_points_on_a_log_axis_with_the_tables_marks(
    tmp_path: Path, trainer_model: Tiny
) -> None:
    profile = profile_of(tmp_path, copy.deepcopy(trainer_model).to(torch.bfloat16), trainer_model)
    axis = layers_figure(profile).axes[0]

    assert axis.get_yscale() == "log"
    names = [layer.module for layer in profile.layers]
    assert [tick.get_text() for tick in axis.get_xticklabels()] == names
    errors = line(axis, ERROR_LABEL)
    assert list(errors.get_xdata()) == list(range(len(names)))
    assert list(errors.get_ydata()) == [layer.error for layer in profile.layers]
    (tolerance,) = [each for each in axis.get_lines() if each.get_label().startswith("tolerance")]
    assert set(tolerance.get_ydata()) == {profile.tolerance}

    table = marked_in_table(profile)
    assert profile.first_past is not None and profile.grows_most is not None
    assert table[profile.first_past.module][0].startswith("first past")
    assert "grows most" in table[profile.grows_most.module]
    shown = labels(axis)
    assert set(shown) == set(table)
    for module, ((x, y), text) in shown.items():
        layer = profile.layers[names.index(module)]
        assert (x, y) == (names.index(module), layer.error)
        if layer is profile.first_past:
            assert f"error enters: {layer.error:.3g}" in text
        if layer is profile.grows_most:
            assert f"grows most: x{layer.growth:.3g}" in text
    assert_no_legend_covers_a_point(axis.figure)


def test_a_nan_layer_is_drawn_at_the_top_and_labelled_where_it_enters(tmp_path: Path, trainer_model: Tiny) -> None:
    engine = copy.deepcopy(trainer_model)
    with torch.no_grad():
        trainer_model.model.layers[1][0].weight[0, 0] = math.nan
    profile = profile_of(tmp_path, engine, trainer_model)
    axis = layers_figure(profile).axes[0]

    names = [layer.module for layer in profile.layers]
    broken = [place for place, layer in enumerate(profile.layers) if not math.isfinite(layer.error)]
    assert broken and names[broken[0]] == "model.layers.1"
    tops = line(axis, "NaN or infinite (drawn at the top)")
    assert list(tops.get_xdata()) == broken
    drawn = list(line(axis, ERROR_LABEL).get_ydata())
    assert min(tops.get_ydata()) > max(drawn[place] for place in range(len(names)) if place not in broken)
    ((x, _), text) = labels(axis)["model.layers.1"]
    assert x == broken[0] and "error enters: not finite (nan)" in text
    assert_no_legend_covers_a_point(axis.figure)


def test_layers_that_match_exactly_are_hollow_points_under_the_tolerance_and_nothing_is_marked(
    tmp_path: Path, trainer_model: Tiny
) -> None:
    profile = profile_of(tmp_path, copy.deepcopy(trainer_model), trainer_model)
    axis = layers_figure(profile).axes[0]

    zeros = line(axis, "exactly 0 (drawn at the bottom)")
    assert list(zeros.get_xdata()) == list(range(len(profile.layers)))
    assert max(zeros.get_ydata()) < profile.tolerance
    assert labels(axis) == {} and marked_in_table(profile) == {}
    assert_no_legend_covers_a_point(axis.figure)


def test_a_layer_where_the_error_both_enters_and_grows_most_gets_both_marks_and_one_label(
    tmp_path: Path, trainer_model: Tiny
) -> None:
    engine = copy.deepcopy(trainer_model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # far below the tolerance in the first layer, far above it in the second
        for layer, scale in ((engine.model.layers[0][0], 1e-6), (engine.model.layers[1][0], 1e-1)):
            layer.weight += torch.randn(layer.weight.shape, generator=generator) * scale
    profile = profile_of(tmp_path, engine, trainer_model)
    assert profile.first_past is profile.grows_most is not None
    assert marked_in_table(profile) == {"model.layers.1": [f"first past {profile.tolerance:g}", "grows most"]}
    axis = layers_figure(profile).axes[0]

    place = [layer.module for layer in profile.layers].index("model.layers.1")
    rings = [each for each in axis.get_lines() if each.get_label().startswith(("the error enters", "it grows most"))]
    assert [(list(ring.get_xdata()), list(ring.get_ydata())) for ring in rings] == [
        ([place], [profile.grows_most.error])
    ] * 2
    ((_, text),) = labels(axis).values()
    growth = profile.grows_most.growth
    assert text == f"error enters: {profile.grows_most.error:.3g}\ngrows most: x{growth:.3g}"
    assert_no_legend_covers_a_point(axis.figure)
