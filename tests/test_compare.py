"""verl-events compare on real demo dumps."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from verl_events.cli import main
from verl_events.compare import op_name

DUMP = "step_{step}/{stage}/step0/rank{rank}/dump.json"


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


def test_a_perturbed_actor_weight_diverges_first_at_the_op_that_reads_it(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    table = tmp_path / "table.csv"
    code, result = compare(capsys, str(demo_runs["a"]), str(demo_runs["perturbed"]), "--step", "1", "--stage", "actor_compute_log_prob", "--csv", str(table))
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
    code, _ = compare(capsys, str(demo_runs["a"]), str(demo_runs["perturbed"]), "--step", "1", "--stage", "ref_compute_log_prob")
    assert code == 0


def test_two_steps_of_one_run(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, result = compare(capsys, str(demo_runs["a"]), "--step", "1", "--vs-step", "2", "--stage", "actor_compute_log_prob")
    assert code == 1
    assert result["a"].endswith("step_1/actor_compute_log_prob/step0/rank0/dump.json")
    assert result["b"].endswith("step_2/actor_compute_log_prob/step0/rank0/dump.json")


def test_two_ranks_of_one_run(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, result = compare(capsys, str(demo_runs["two_ranks"]), "--step", "1", "--stage", "ref_compute_log_prob", "--rank", "0", "--vs-rank", "1")
    assert code == 1  # each rank samples its own batch
    assert result["b"].endswith("rank1/dump.json")


def test_unmatched_entries_are_never_reported_as_passing(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
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


def test_nan_and_inf_in_a_dump_parse_and_are_reported(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
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
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, layout: str, args: list[str], message: str
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


def test_a_second_side_or_a_vs_option_is_required(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(demo_runs["a"]), "--step", "1", "--stage", "actor_update"]) == 2
    assert "give a second run B" in capsys.readouterr().err


def test_the_text_summary_names_the_first_divergence(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compare", str(demo_runs["a"]), str(demo_runs["perturbed"]), "--step", "1", "--stage", "actor_compute_log_prob", "--top", "2"])
    out = capsys.readouterr().out
    assert code == 1
    assert "DIVERGED. First divergence in execution order: Functional.linear.6.forward" in out
    assert "Largest relative errors:" in out


def test_tolerances_can_be_loosened(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    loose = ["--max-rtol", "1e9", "--min-rtol", "1e9", "--mean-rtol", "1e9", "--norm-rtol", "1e9"]
    code, result = compare(capsys, str(demo_runs["a"]), str(demo_runs["perturbed"]), "--step", "1", "--stage", "actor_compute_log_prob", *loose)
    assert code == 0 and result["tolerances"]["norm"] == 1e9
