"""verl-events compare: the verdict on synthetic rows, then on real demo dumps.

The end-to-end tests assert only what holds on any CPU: two runs on one
machine with one seed are identical, a perturbed weight is first read by one
op, and loosened tolerances accept any finite difference.  Numbers that
depend on a CPU's rounding are left to the synthetic rows.
"""

from __future__ import annotations

import copy
import csv
import importlib.metadata
import json
import math
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from verl_events.apps.cli import main
from verl_events.apps.compare import (
    DEFAULT_TOLERANCES,
    STATS,
    CompareInputError,
    Row,
    Tolerance,
    compare_rows,
    judge,
    module_of,
    op_name,
    over_tolerance,
    resolve_tolerances,
    rows_from_msprobe_csv,
    summary,
)
from verl_events.apps.demo.options import INJECTED_WEIGHT

DUMP = "step_{step}/{stage}/step0/rank{rank}/dump.json"
LOOSE = resolve_tolerances(dict.fromkeys(STATS, 1e9), dict.fromkeys(STATS, 1e9))


def stats(**values: float | None) -> dict[str, float | None]:
    """A tensor of magnitude 1 (max 1, min -1) with the given statistics changed."""
    return {"max": 1.0, "min": -1.0, "mean": 0.0, "norm": 10.0, **values}


def row(
    a: dict[str, float | None], b: dict[str, float | None], entry: str = "Functional.layer_norm.0.forward.output.0"
) -> Row:
    return Row(entry=entry, matched=True, dtypes=("torch.float32", "torch.float32"), a_stats=a, b_stats=b)


# -- the verdict on synthetic rows -------------------------------------------------


@pytest.mark.parametrize(("a", "b"), [(0.0, 1e-9), (1e-9, 0.0), (-1e-9, 1e-9)])
def test_a_near_zero_mean_is_close_to_noise_far_below_the_magnitude(a: float, b: float) -> None:
    close = row(stats(mean=a), stats(mean=b))
    assert judge(close, DEFAULT_TOLERANCES) == ""
    assert over_tolerance(close, DEFAULT_TOLERANCES)["mean"] < 1


def test_a_mean_shifted_by_half_the_magnitude_diverges() -> None:
    shifted = row(stats(mean=0.0), stats(mean=0.5))
    assert judge(shifted, DEFAULT_TOLERANCES).startswith("mean 0 in A vs 0.5 in B: off by 0.5, ")
    assert over_tolerance(shifted, DEFAULT_TOLERANCES)["mean"] > 1


def test_the_mean_tolerance_scales_with_the_magnitude_of_b() -> None:
    """The same mean shift is noise in a tensor of magnitude 1000 and a divergence in one of magnitude 1."""
    big = {"max": 1000.0, "min": -1000.0, "norm": 1e4}
    assert judge(row(stats(mean=0.0, **big), stats(mean=0.1, **big)), DEFAULT_TOLERANCES) == ""
    assert judge(row(stats(mean=0.0), stats(mean=0.1)), DEFAULT_TOLERANCES).startswith("mean ")


@pytest.mark.parametrize(
    ("a", "b", "close"),
    [
        (math.nan, math.nan, True),
        (math.nan, 1.0, False),
        (1.0, math.nan, False),
        (math.inf, math.inf, True),
        (-math.inf, -math.inf, True),
        (math.inf, -math.inf, False),
        (math.inf, 1.0, False),
        (math.nan, math.inf, False),
    ],
)
def test_nan_and_inf_are_close_only_to_themselves_whatever_the_tolerance(a: float, b: float, close: bool) -> None:
    for tolerances in (DEFAULT_TOLERANCES, LOOSE):
        special = row(stats(norm=a), stats(norm=b))
        assert judge(special, tolerances) == ("" if close else f"norm is {a} in A but {b} in B")
        assert over_tolerance(special, tolerances)["norm"] == (0.0 if close else math.inf)


def test_loosening_rtol_turns_a_divergence_into_a_match() -> None:
    off = row(stats(norm=10.5), stats(norm=10.0))
    assert judge(off, DEFAULT_TOLERANCES).startswith("norm 10.5 in A vs 10 in B")
    assert judge(off, resolve_tolerances(rtol={"norm": 0.1})) == ""


def test_an_atol_loosens_a_statistic_that_is_exactly_zero_in_b() -> None:
    """No rtol can: rtol * |b| is 0.  This was msprobe's infinite relative error."""
    off = row(stats(max=1e-6, min=-1.0), stats(max=0.0, min=-1.0))
    assert (
        judge(off, resolve_tolerances(rtol={"max": 1e9}))
        == "max 1e-06 in A vs 0 in B: off by 1e-06, where its tolerance is 0"
    )
    assert over_tolerance(off, DEFAULT_TOLERANCES)["max"] == math.inf
    assert judge(off, resolve_tolerances(atol={"max": 1e-3})) == ""


def test_every_statistic_past_its_tolerance_is_named() -> None:
    off = row(stats(max=2.0, norm=20.0), stats())
    reasons = judge(off, DEFAULT_TOLERANCES).split("; ")
    assert [reason.split()[0] for reason in reasons] == ["max", "norm"]


def test_statistics_missing_on_either_side_are_not_judged() -> None:
    """msprobe has no mean or norm for an integer tensor and nothing for a non-tensor (N/A)."""
    integers = row(stats(mean=None, norm=None), stats(mean=3.0, norm=None))
    assert judge(integers, DEFAULT_TOLERANCES) == ""
    assert set(over_tolerance(integers, DEFAULT_TOLERANCES)) == {"max", "min"}
    nothing = row(dict.fromkeys(STATS), dict.fromkeys(STATS))
    assert judge(nothing, DEFAULT_TOLERANCES) == "" and over_tolerance(nothing, DEFAULT_TOLERANCES) == {}


def test_a_dtype_mismatch_diverges_whatever_the_statistics() -> None:
    cast = Row(entry="x", matched=True, dtypes=("torch.bfloat16", "torch.float32"), a_stats=stats(), b_stats=stats())
    assert judge(cast, LOOSE) == "dtype torch.bfloat16 vs torch.float32"


def test_an_entry_on_one_side_only_diverges_and_has_no_ratio() -> None:
    alone = Row(entry="x", matched=False, side="B")
    assert judge(alone, LOOSE) == "only in B"
    assert over_tolerance(alone, LOOSE) == {}


def test_worst_ranks_rows_by_how_far_past_tolerance_they_are_not_by_relative_error() -> None:
    rows = [
        row(
            stats(mean=1e-9), stats(mean=0.0), entry="near_zero_mean"
        ),  # infinite relative error, well within tolerance
        row(stats(), stats(), entry="equal"),
        row(stats(max=1.02), stats(), entry="max_2x"),  # relative error 2 %, twice its tolerance
        Row(entry="only_in_b", matched=False, side="B"),
        row(stats(norm=10.1), stats(), entry="norm_10x"),  # relative error 1 %, ten times its tolerance
        row(stats(norm=math.nan), stats(), entry="nan"),
    ]
    comparison = compare_rows(Path("a"), Path("b"), rows)
    assert [r.entry for r in comparison.worst(10)] == ["nan", "norm_10x", "max_2x", "near_zero_mean", "equal"]
    assert [item["entry"] for item in summary(comparison, 2)["worst"]] == ["nan", "norm_10x"]
    assert [r.entry for r in comparison.problems] == ["max_2x", "only_in_b", "norm_10x", "nan"]


def tensor(entry: str, size: int, a: tuple[float, ...], b: tuple[float, ...], dtype: str = "torch.float32") -> Row:
    """A row as msprobe's table has it: max, min, mean and norm on each side, and the element count."""
    return Row(
        entry=entry,
        matched=True,
        dtypes=(dtype, dtype),
        sizes=(size, size),
        a_stats=dict(zip(STATS, a, strict=True)),
        b_stats=dict(zip(STATS, b, strict=True)),
    )


#: Rows of the demo's actor_update with one actor weight scaled by 1.01 (verl-events demo --perturb
#: 0.01, level L1), in execution order, with the numbers msprobe recorded.
PERTURBED_ACTOR_UPDATE = [
    # blocks.1.mlp.0 reads the perturbed weight (input 1): its norm and its output's moved 1 %.
    tensor(
        "Functional.linear.6.forward.input.0",
        16 * 23 * 64,
        (3.638167, -3.977506, -1.62e-10, 153.46623),
        (3.638167, -3.977506, -1.62e-10, 153.46623),
    ),
    tensor(
        "Functional.linear.6.forward.input.1",
        256 * 64,
        (0.1249877, -0.1249773, 0.00043642, 9.2341299),
        (0.1262376, -0.1262271, 0.00044078, 9.3264704),
    ),
    tensor(
        "Functional.linear.6.forward.input.2",
        256,
        (0.1246364, -0.124488, -0.0030905, 1.1133572),
        (0.1246364, -0.124488, -0.0030905, 1.1133572),
    ),
    tensor(
        "Functional.linear.6.forward.output.0",
        16 * 23 * 256,
        (2.588331, -2.427673, 0.00072184, 180.00887),
        (2.613234, -2.451874, 0.00075996, 181.78369),
    ),
    # pg_loss, the mean of ratio * advantages (whitened, centred on zero): rounding noise in both runs.
    tensor(
        "Tensor.mean.0.forward.input.0",
        16 * 16,
        (2.7634389, -2.6134477, 0.0, 15.968693),
        (2.763797, -2.6137307, -3.7252903e-08, 15.968694),
    ),
    tensor("Tensor.mean.0.forward.output.0", 1, (0.0, 0.0, 0.0, 0.0), (-3.7252903e-08,) * 4),
    # log_prob - old_log_prob (exactly 0 in the unperturbed run), then its mean: the KL term.
    tensor(
        "Tensor.__sub__.1.forward.input.0",
        16 * 16,
        (-3.0369253, -7.031929, -4.6149282, 74.478157),
        (-3.0367503, -7.0325699, -4.6150317, 74.479836),
    ),
    tensor(
        "Tensor.__sub__.1.forward.input.1",
        16 * 16,
        (-3.0369253, -7.031929, -4.6149282, 74.478157),
        (-3.0369253, -7.031929, -4.6149282, 74.478157),
    ),
    tensor(
        "Tensor.__sub__.1.forward.output.0",
        16 * 16,
        (0.0, 0.0, 0.0, 0.0),
        (0.0022459, -0.0025301, -0.00010353886, 0.01559209),
    ),
    tensor(
        "Tensor.mean.1.forward.input.0",
        16 * 16,
        (0.0, 0.0, 0.0, 0.0),
        (0.0022459, -0.0025301, -0.00010353886, 0.01559209),
    ),
    tensor("Tensor.mean.1.forward.output.0", 1, (0.0, 0.0, 0.0, 0.0), (-0.00010353886,) * 4),
    # loss = policy_loss + ...: policy_loss is minus the mean above (msprobe does not hook unary minus).
    tensor("Tensor.__add__.5.forward.input.0", 1, (-0.0,) * 4, (3.7252903e-08,) * 4),
    # Adam's squared-gradient average of a weight, first step: its min is 1e-10 of its max.
    tensor("Tensor.addcmul_.8.forward.input.0", 64 * 64, (0.0,) * 4, (0.0,) * 4),
    tensor(
        "Tensor.addcmul_.8.forward.input.1",
        64 * 64,
        (0.0028211, -0.0026971, 7.146e-12, 0.040014464),
        (0.002822, -0.0026982, 3.306e-12, 0.040021062),
    ),
    tensor(
        "Tensor.addcmul_.8.forward.input.2",
        64 * 64,
        (0.0028211, -0.0026971, 7.146e-12, 0.040014464),
        (0.002822, -0.0026982, 3.306e-12, 0.040021062),
    ),
    tensor("Tensor.addcmul_.8.forward.input.value", 1, (0.001,) * 4, (0.001,) * 4, dtype="<class 'float'>"),
    tensor(
        "Tensor.addcmul_.8.forward.output.0",
        64 * 64,
        (7.9585503e-09, 5.6349491e-18, 3.9090745e-10, 5.0174378e-08),
        (7.963556e-09, 2.7005166e-20, 3.9103656e-10, 5.0204136e-08),
    ),
]


def test_near_zero_statistics_no_longer_lead_the_worst_list() -> None:
    """Issue 17: the min of Adam's squared-gradient average (5.6e-18 vs 2.7e-20) was 2.08e+04x its
    tolerance and a loss of 0 vs 3.7e-8 1e+03x, ahead of the weight that moved 1 %.  Measured
    against a tenth of their op's scale they rank last; the verdict on them is unchanged."""
    comparison = compare_rows(Path("a"), Path("b"), copy.deepcopy(PERTURBED_ACTOR_UPDATE))
    by_entry = {r.entry: r for r in comparison.rows}
    noise = [
        "Tensor.addcmul_.8.forward.output.0",
        "Tensor.mean.0.forward.output.0",
        "Tensor.__add__.5.forward.input.0",
        "Tensor.mean.1.forward.output.0",
    ]
    assert [by_entry[e].worst > 100 for e in noise] == [True] * 4  # what used to lead ...
    assert all(by_entry[e].problem for e in noise)  # ... still diverges by the tolerances
    assert [r.entry for r in comparison.worst(3)] == [
        "Functional.linear.6.forward.input.1",
        "Functional.linear.6.forward.output.0",
        "Tensor.__sub__.1.forward.output.0",
    ]
    assert [by_entry[e].distance < 1 for e in noise] == [True] * 4
    weight = by_entry["Functional.linear.6.forward.input.1"]
    assert weight.distance == weight.worst == pytest.approx(9.9, abs=0.05)  # not near zero: its ratio stands
    listed = summary(comparison, 2)["worst"]
    assert [item["entry"] for item in listed] == [r.entry for r in comparison.worst(2)]
    assert listed[0]["distance"] == weight.distance and listed[0]["over_tol"] == weight.worst


def test_a_cancellation_is_measured_against_the_scale_it_was_computed_from() -> None:
    """The mean of log_prob - old_log_prob has a scale of 1e-4 of its own, and of the log-probs
    (4.6) by the difference it was computed from; carried one op further, it stays near zero."""
    comparison = compare_rows(Path("a"), Path("b"), copy.deepcopy(PERTURBED_ACTOR_UPDATE))
    by_entry = {r.entry: r for r in comparison.rows}
    log_probs = by_entry["Tensor.__sub__.1.forward.input.0"].scale
    assert log_probs == pytest.approx(74.48 / 16, rel=1e-3)  # their root mean square
    for entry in (
        "Tensor.__sub__.1.forward.output.0",
        "Tensor.mean.1.forward.input.0",
        "Tensor.mean.1.forward.output.0",
    ):
        assert by_entry[entry].scale == log_probs, entry
    # The -0.0 fed to the loss is minus pg_loss's mean, so it has that mean's op's scale.
    assert by_entry["Tensor.__add__.5.forward.input.0"].scale == by_entry["Tensor.mean.0.forward.output.0"].scale
    assert by_entry["Tensor.mean.0.forward.output.0"].scale == pytest.approx(15.97 / 16, rel=1e-3)
    # A Python number (Adam's 1 - beta2) is no scale for the tensors it multiplies.
    assert by_entry["Tensor.addcmul_.8.forward.output.0"].scale == pytest.approx(0.040021062 / 64)


def test_a_statistic_at_least_a_tenth_of_its_scale_keeps_its_ratio_over_tolerance() -> None:
    rows = [tensor("Functional.gelu.1.forward.output.0", 100, (1.0, -0.5, 0.3, 10.2), (1.0, -0.5, 0.3, 10.0))]
    (judged,) = compare_rows(Path("a"), Path("b"), rows).rows
    assert judged.distances["norm"] == judged.over["norm"] == pytest.approx(20)
    assert judged.distance <= judged.worst


def test_a_gradient_is_measured_against_its_own_scale_not_the_incoming_gradient() -> None:
    """d loss / d loss is 1; carried down the backward pass it would make every gradient near zero."""
    rows = [
        tensor("Tensor.mean.0.backward.input.0", 1, (-1.0,) * 4, (-1.0,) * 4),
        # 1/256 in B, 2 % more in A
        tensor("Tensor.mean.0.backward.output.0", 256, (-0.00398,) * 3 + (0.06375,), (-0.00390625,) * 3 + (0.0625,)),
    ]
    gradient = compare_rows(Path("a"), Path("b"), rows).rows[1]
    assert gradient.scale == pytest.approx(0.06375 / 16)  # its own root mean square, the larger side's
    assert gradient.distance == gradient.worst == pytest.approx(20)


@pytest.mark.parametrize(
    ("entry", "construct", "module"),
    [
        (
            "Functional.linear.6.forward.input.1",
            {"Functional.linear.6.forward": "Module.blocks.1.mlp.0.Linear.forward.0"},
            "blocks.1.mlp.0",
        ),
        (
            "Functional.linear.8.backward.output.0",
            {"Functional.linear.8.backward": "Module.head.Linear.backward.0"},
            "head",
        ),
        ("Module.blocks.1.mlp.0.Linear.forward.0.parameters.weight", {}, "blocks.1.mlp.0"),
        ("Module.head.Linear.parameters_grad.0.weight", {}, "head"),
        ("Tensor.__add__.0.forward.output.0", {"Tensor.__add__.0.forward": None}, None),  # the root model's own op
        ("Functional.linear.6.forward.input.1", {}, None),  # level L1: construct.json is {}
    ],
)
def test_each_row_names_the_module_it_ran_in(entry: str, construct: dict[str, str | None], module: str | None) -> None:
    assert module_of(entry, construct) == module


def test_the_summary_lists_the_tolerances_it_judged_with() -> None:
    tolerances = resolve_tolerances(rtol={"norm": 0.5}, atol={"max": 0.25})
    listed = summary(compare_rows(Path("a"), Path("b"), [], tolerances), 5)["tolerances"]
    assert listed["norm"] == {"rtol": 0.5, "atol": DEFAULT_TOLERANCES["norm"].atol}
    assert listed["max"] == {"rtol": DEFAULT_TOLERANCES["max"].rtol, "atol": 0.25}
    assert listed["mean"] == {"rtol": DEFAULT_TOLERANCES["mean"].rtol, "atol": DEFAULT_TOLERANCES["mean"].atol}


@pytest.mark.parametrize(
    ("rtol", "atol", "message"),
    [
        ({"mean": -1.0}, None, "the rtol of mean must be a finite number >= 0, got -1.0"),
        (None, {"norm": math.nan}, "the atol of norm must be a finite number >= 0, got nan"),
        (None, {"max": math.inf}, "the atol of max must be a finite number >= 0, got inf"),
        (
            {"median": 0.1},
            None,
            "compare has no statistic 'median' to give an rtol; the statistics are max, min, mean, norm",
        ),
    ],
)
def test_a_bad_tolerance_is_refused_with_its_statistic_and_value(
    rtol: dict[str, float] | None, atol: dict[str, float] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_tolerances(rtol, atol)


def test_a_tolerance_built_directly_is_checked_too() -> None:
    with pytest.raises(ValueError, match=re.escape("a tolerance's atol must be a finite number >= 0, got -0.1")):
        Tolerance(rtol=0.1, atol=-0.1)


def test_judging_with_a_statistic_left_out_is_refused() -> None:
    with pytest.raises(ValueError, match="compare tolerances must cover max, min, mean, norm; min, mean missing"):
        compare_rows(Path("a"), Path("b"), [], {"max": Tolerance(0.1), "norm": Tolerance(0.1)})


def test_a_bad_tolerance_on_the_command_line_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "a.json", "b.json", "--mean-atol", "-0.5"]) == 2
    assert "error: the atol of mean must be a finite number >= 0, got -0.5" in capsys.readouterr().err


def test_the_command_line_help_states_the_default_tolerances(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for stat, tolerance in DEFAULT_TOLERANCES.items():
        assert (
            f"--{stat}-rtol {stat.upper()}_RTOL relative tolerance of {stat}, "
            f"a fraction of B's {stat} (default {tolerance.rtol:g})" in text
        )
        assert (
            f"--{stat}-atol {stat.upper()}_ATOL absolute tolerance of {stat}, "
            f"a fraction of the tensor's largest |value| in B (default {tolerance.atol:g})" in text
        )


def test_the_docs_state_the_default_tolerances() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "report-and-compare.md").read_text(encoding="utf-8")
    for stat, tolerance in DEFAULT_TOLERANCES.items():
        line = next(line for line in docs.splitlines() if line.startswith("| **") and f"**{stat}**" in line)
        assert line.split("|")[2:4] == [f" {tolerance.rtol:g} ", f" {tolerance.atol:g} "], line


# -- real demo dumps ----------------------------------------------------------------


def compare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["compare", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_two_runs_with_the_same_seed_match(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, result = compare(capsys, str(demo_runs["a"]), str(demo_runs["b"]), "--step", "1", "--stage", "actor_update")
    assert code == 0 and result["verdict"] == "match"
    counts = result["counts"]
    assert counts["entries"] == counts["matched"] > 1000 and counts["unmatched"] == counts["diverged"] == 0
    assert result["first_divergence"] is None


def test_a_perturbed_actor_weight_diverges_first_at_the_op_that_reads_it(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    table = tmp_path / "table.csv"
    code, result = compare(
        capsys,
        str(demo_runs["a"]),
        str(demo_runs["perturbed"]),
        "--step",
        "1",
        "--stage",
        "actor_compute_log_prob",
        "--csv",
        str(table),
    )
    assert code == 1 and result["verdict"] == "diverged"
    # blocks.1.mlp.0 is the seventh linear of the forward pass; its weight is input 1.
    assert result["first_divergence"]["op"] == "Functional.linear.6.forward"
    assert result["first_divergence"]["entry"] == "Functional.linear.6.forward.input.1"
    with table.open() as handle:
        rows = list(csv.DictReader(handle))
    first = next(r for r in rows if r["verdict"] == "diverged")
    assert first["entry"] == "Functional.linear.6.forward.input.1"
    assert all(r["verdict"] == "ok" for r in rows[: rows.index(first)])
    # The reference model was not perturbed, so its stage still matches.
    code, _ = compare(
        capsys, str(demo_runs["a"]), str(demo_runs["perturbed"]), "--step", "1", "--stage", "ref_compute_log_prob"
    )
    assert code == 0


def test_at_l1_no_module_is_named(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Level L1 records API calls only: its construct.json is {}."""
    args = ("--step", "1", "--stage", "actor_compute_log_prob")
    _, result = compare(capsys, str(demo_runs["a"]), str(demo_runs["perturbed"]), *args)
    assert result["first_divergence"]["module"] is None
    assert {item["module"] for item in result["worst"]} == {None}


def test_the_worst_list_of_a_perturbed_update_is_led_by_what_moved_not_by_near_zero_noise(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One weight scaled by 1.01 moves what reads it, its gradients and Adam's state by about 1 %
    (10x the norm's tolerance); rounding noise in statistics near zero (a loss of 0 vs 3.7e-8,
    Adam's min of 5.6e-18 vs 2.7e-20) was 1e+03 to 2e+04x its tolerance and led the list."""
    args = ("--step", "1", "--stage", "actor_update", "--top", "10")
    code, result = compare(capsys, str(demo_runs["a"]), str(demo_runs["perturbed"]), *args)
    assert code == 1
    worst = result["worst"]
    assert len(worst) == 10
    assert all(1 < item["distance"] <= item["over_tol"] < 100 for item in worst), worst
    assert [item["distance"] for item in worst] == sorted((item["distance"] for item in worst), reverse=True)


@pytest.fixture(scope="module")
def module_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """For levels mix and L0: a demo run and one with the actor weight perturbed, dumping step 1's
    actor_compute_log_prob (the four runs at once: each is a few seconds of starting torch)."""
    pytest.importorskip("torch")
    pytest.importorskip("msprobe")
    from .conftest_runs import demo_run
    from .observers.support import write_msprobe_config

    root = tmp_path_factory.mktemp("module_runs")
    jobs = {}
    for level in ("mix", "L0"):
        msprobe = write_msprobe_config(root / f"msprobe_{level}.json", level=level)
        observer = {"name": "msprobe", "config_path": str(msprobe), "steps": [1], "stages": ["actor_compute_log_prob"]}
        config = root / f"{level}.yaml"
        config.write_text(json.dumps({"observers": [observer]}))  # JSON is YAML
        for side, extra in (("a", []), ("perturbed", ["--perturb", "0.01"])):
            jobs[level, side] = (root / f"{level}_{side}", "--steps", "1", "--config", str(config), *extra)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        done = {key: pool.submit(demo_run, *job) for key, job in jobs.items()}
        runs = {key: future.result() for key, future in done.items()}
    return {level: (runs[level, "a"], runs[level, "perturbed"]) for level in ("mix", "L0")}


@pytest.mark.parametrize(
    ("level", "op", "entry"),
    [
        ("mix", "Functional.linear.6.forward", "Functional.linear.6.forward.input.1"),
        ("L0", "Module.blocks.1.mlp.0.Linear.forward", "Module.blocks.1.mlp.0.Linear.forward.0.parameters.weight"),
    ],
)
def test_the_first_divergence_names_the_module_it_ran_in(
    module_runs: dict[str, tuple[Path, Path]],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    level: str,
    op: str,
    entry: str,
) -> None:
    """At mix an API call's module comes from construct.json; at L0 the op is the module."""
    module = INJECTED_WEIGHT.rpartition(".")[0]  # blocks.1.mlp.0, whose weight --perturb scales
    a, perturbed = module_runs[level]
    args = (str(a), str(perturbed), "--step", "1", "--stage", "actor_compute_log_prob")
    table = tmp_path / "table.csv"
    code, result = compare(capsys, *args, "--csv", str(table))
    assert code == 1
    assert result["first_divergence"] == {
        "op": op,
        "module": module,
        "entry": entry,
        "reason": result["first_divergence"]["reason"],
    }
    # Everything downstream of the weight runs in a module of blocks.1 or after it.
    assert all(item["module"] for item in result["worst"]), result["worst"]
    with table.open() as handle:
        first = next(row for row in csv.DictReader(handle) if row["verdict"] == "diverged")
    assert (first["entry"], first["module"]) == (entry, module)
    assert main(["compare", *args]) == 1
    assert f"DIVERGED. First divergence in execution order: {op} in module {module}\n" in capsys.readouterr().out


def test_two_steps_of_one_run(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, result = compare(
        capsys, str(demo_runs["a"]), "--step", "1", "--vs-step", "2", "--stage", "actor_compute_log_prob"
    )
    assert code == 1
    assert result["a"].endswith("step_1/actor_compute_log_prob/step0/rank0/dump.json")
    assert result["b"].endswith("step_2/actor_compute_log_prob/step0/rank0/dump.json")


def test_two_ranks_of_one_run(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, result = compare(
        capsys,
        str(demo_runs["two_ranks"]),
        "--step",
        "1",
        "--stage",
        "ref_compute_log_prob",
        "--rank",
        "0",
        "--vs-rank",
        "1",
    )
    assert code == 1  # each rank samples its own batch
    assert result["b"].endswith("rank1/dump.json")


def test_unmatched_entries_are_never_reported_as_passing(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = demo_runs["a"] / DUMP.format(step=1, stage="actor_compute_log_prob", rank=0)
    dump = json.loads(source.read_text())
    dropped = next(name for name in dump["data"] if name.startswith("Functional.gelu"))
    del dump["data"][dropped]
    edited = tmp_path / "dump.json"
    edited.write_text(json.dumps(dump))
    code, result = compare(capsys, str(source), str(edited))
    assert code == 1
    assert result["counts"]["unmatched"] > 0
    assert result["first_divergence"]["op"] == op_name(dropped)
    assert result["first_divergence"]["reason"] == "only in A"


def test_nan_and_inf_in_a_dump_parse_and_are_reported(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = demo_runs["a"] / DUMP.format(step=1, stage="actor_compute_log_prob", rank=0)
    dump = json.loads(source.read_text())
    target = next(name for name in dump["data"] if name.startswith("Functional.linear.2"))
    output = dump["data"][target]["output"][0]
    output["Max"], output["Norm"] = float("inf"), float("nan")
    edited = tmp_path / "dump.json"
    edited.write_text(json.dumps(dump))  # bare Infinity / NaN, as msprobe writes them
    assert "Infinity" in edited.read_text()
    code, result = compare(capsys, str(source), str(edited))
    assert code == 1
    assert result["first_divergence"]["entry"] == f"{target}.output.0"
    assert "inf in B" in result["first_divergence"]["reason"]


@pytest.mark.parametrize(
    ("layout", "args", "message"),
    [
        ("run", ["--step", "9", "--stage", "actor_update"], "step 9 of stage 'actor_update' was not dumped"),
        ("run", [], "is a run directory; choose a dump with --step and --stage (steps here: step_1, step_2"),
        ("run", ["--step", "1", "--stage", "actor_update", "--rank", "3"], "rank3 does not exist; ranks here: rank0"),
        ("proc", [], "holds msprobe proc4242 dumps, written without a rank; pass the dump.json itself"),
        ("half", [], "has no dump.json: the stage was not dumped here, or the run stopped before msprobe"),
        ("missing", [], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    demo_runs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    layout: str,
    args: list[str],
    message: str,
) -> None:
    run = demo_runs["a"]
    if layout == "proc":
        proc = tmp_path / "step0" / "proc4242"
        proc.mkdir(parents=True)
        shutil.copy(run / DUMP.format(step=1, stage="actor_update", rank=0), proc / "dump.json")
        target = tmp_path
    elif layout == "half":
        target = tmp_path / "step_1" / "actor_update" / "step0" / "rank0"
        target.mkdir(parents=True)
        (target / "stack.json").write_text("{}")
    elif layout == "missing":
        target = tmp_path / "nowhere"
    else:
        target = run
    code = main(["compare", str(target), str(run / DUMP.format(step=1, stage="actor_update", rank=0)), *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_second_side_or_a_vs_option_is_required(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", str(demo_runs["a"]), "--step", "1", "--stage", "actor_update"]) == 2
    assert "give a second run B" in capsys.readouterr().err


def test_the_text_summary_names_the_first_divergence(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "compare",
            str(demo_runs["a"]),
            str(demo_runs["perturbed"]),
            "--step",
            "1",
            "--stage",
            "actor_compute_log_prob",
            "--top",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "DIVERGED. First divergence in execution order: Functional.linear.6.forward" in out
    assert "Furthest from tolerance (|a-b| / tolerance; above 1 diverged):" in out
    tolerances = "max rtol 0.01, atol 0; min rtol 0.01, atol 0; mean rtol 0.01, atol 0.001; norm rtol 0.001, atol 0"
    assert f"M: B's largest |value|): {tolerances}\n" in out


def test_tolerances_can_be_loosened_until_a_perturbed_run_matches(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Loose enough for any finite difference, so the verdict holds whatever this CPU's rounding."""
    loose = [arg for stat in STATS for kind in ("rtol", "atol") for arg in (f"--{stat}-{kind}", "1e9")]
    code, result = compare(
        capsys,
        str(demo_runs["a"]),
        str(demo_runs["perturbed"]),
        "--step",
        "1",
        "--stage",
        "actor_compute_log_prob",
        *loose,
    )
    assert code == 0 and result["verdict"] == "match" and result["first_divergence"] is None
    assert result["tolerances"]["norm"] == {"rtol": 1e9, "atol": 1e9}


def test_a_session_cut_off_is_never_compared(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """kill -9 inside a dumped stage leaves the session's marker (and maybe a partial
    dump.json): compare says incomplete and exits 2, never MATCH or DIVERGED."""
    cut = tmp_path / "cut"
    shutil.copytree(demo_runs["a"], cut)
    rank_dir = cut / "step_2/actor_update/step0/rank0"
    (rank_dir / "session.incomplete").write_text("cut off during step 2 actor_update (rank 0)\n")
    for a, b in ((cut, demo_runs["a"]), (demo_runs["a"], cut), (cut, cut)):
        assert main(["compare", str(a), str(b), "--step", "2", "--stage", "actor_update"]) == 2
        assert (
            "is an incomplete msprobe session, not a whole stage: cut off during step 2 actor_update (rank 0)"
            in capsys.readouterr().err
        )
    assert (
        main(
            ["compare", str(rank_dir / "dump.json"), str(demo_runs["a"] / "step_2/actor_update/step0/rank0/dump.json")]
        )
        == 2
    )


def test_an_msprobe_without_its_compare_exits_2_naming_the_version_and_the_name(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from msprobe.pytorch.compare import pt_compare

    monkeypatch.delattr(pt_compare, "pt_compare")
    dump = demo_runs["a"] / DUMP.format(step=1, stage="actor_update", rank=0)
    assert main(["compare", str(dump), str(dump)]) == 2
    version = importlib.metadata.version("mindstudio-probe")
    assert (
        f"error: msprobe {version} (mindstudio-probe) lacks what verl-events compare relies on: "
        "msprobe.pytorch.compare.pt_compare.pt_compare. verl_events is written against mindstudio-probe>=26.2,<27"
    ) in capsys.readouterr().err


def test_md5_dumps_are_refused_rather_than_called_a_match(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """msprobe's table for md5 dumps has no statistics, which is all compare judges."""
    torch = pytest.importorskip("torch")  # a real md5 dump of a real model
    pytest.importorskip("msprobe")

    import verl_events

    config = tmp_path / "md5.json"
    config.write_text(
        json.dumps(
            {
                "task": "statistics",
                "level": "L1",
                "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "md5"},
            }
        )
    )
    model = torch.nn.Linear(4, 1)
    observer = {"name": "msprobe", "config_path": str(config), "warm_up": False}
    with verl_events.install({"save_path": str(tmp_path / "run"), "observers": [observer]}):
        with verl_events.stage("actor_update", step=1, model=model):
            model(torch.ones(2, 4)).sum().backward()
    dump = tmp_path / "run" / DUMP.format(step=1, stage="actor_update", rank=0)
    assert main(["compare", str(dump), str(dump)]) == 2
    assert "has no column 'NPU max', 'NPU min', 'NPU mean', 'NPU l2norm', 'Bench max'" in capsys.readouterr().err


def test_an_empty_compare_table_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "compare_result.csv"
    table.write_text("")
    with pytest.raises(
        CompareInputError, match=re.escape(f"msprobe's compare table {table} has no column 'NPU Name', 'Bench Name'")
    ):
        rows_from_msprobe_csv(table)


def test_a_step_folder_with_stage_picks_that_stage_on_both_sides(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = demo_runs["a"] / "step_1", demo_runs["b"] / "step_1"
    code, result = compare(capsys, str(a), str(b), "--stage", "actor_update")
    assert code == 0, result
    assert result["a"] == str(a / "actor_update/step0/rank0/dump.json")
    assert main(["compare", str(a), str(b), "--stage", "critic_nope"]) == 2
    assert "stage 'critic_nope' was not dumped (stages here: " in capsys.readouterr().err
