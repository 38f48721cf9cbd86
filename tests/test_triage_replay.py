"""``verl-events triage`` reads a replayed stage's dump first (issue 18, part 2).

Everything here is real: the sentinel raises the anomaly, the stage is replayed
in place by ``@emits_stage``, msprobe 26.2 dumps the replay to
``step_N/{stage}.replay`` (CPU torch) and the sentinel writes its verdict to
replays.jsonl.  The first tests run a small worker in this process; the slow
ones run docs/sentinel.md's demo commands, twice in a row as users do, and the
demo on two gloo ranks.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")  # the stage runs a torch model, msprobe dumps it
pytest.importorskip("msprobe")

import verl_events
from verl_events import emits_stage
from verl_events.apps.cli import main
from verl_events.layout import RUN_ID_ENV

from .observers.support import NET_FILE, Net, forward_line, write_msprobe_config
from .support import verl_events_exe

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs/sentinel.md").read_text()
STAGE = "actor_compute_log_prob"
REPLAY = f"{STAGE}.replay"


class Worker:
    """verl's attribute names: the model at ``actor_module``, the step at ``global_step``."""

    def __init__(self) -> None:
        self.actor_module = Net()
        self.global_step = 0
        self.flaky_calls = 0  # how many next calls return a NaN of their own (a kernel gone wrong once)

    @emits_stage(STAGE)  # forward-only: replayed by default
    def compute_log_prob(self, data: dict[str, Any]) -> dict[str, Any]:
        with torch.no_grad():
            out = self.actor_module(data["x"])
        if self.flaky_calls:
            self.flaky_calls -= 1
            out = out.clone()
            out[0, 0] = math.nan
        return {"old_log_probs": out}


@contextmanager
def fresh_run() -> Iterator[None]:
    """Each installation a run of its own (no run id inherited from the environment)."""
    saved = os.environ.pop(RUN_ID_ENV, None)
    try:
        yield
    finally:
        os.environ.pop(RUN_ID_ENV, None)
        if saved is not None:
            os.environ[RUN_ID_ENV] = saved


def batch() -> torch.Tensor:
    """The stage's input, the same at every step."""
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(1))


def replay_run(save_path: Path, change: dict[int, str], rules: dict[str, Any] | None = None) -> Path:
    """The worker's stage at steps 1-3 under the sentinel and msprobe (level mix,
    armed by anomalies, and dumping step 1); before step s, ``change[s]`` sets
    fc1's weight[0, 0] to NaN for good ("nan"), scales fc1's weight by 1000 for
    good ("scale"), or makes that step's own call return a NaN ("flaky")."""
    torch.manual_seed(0)
    worker, x = Worker(), batch()
    config = write_msprobe_config(save_path.parent / f"{save_path.name}-msprobe.json", level="mix")
    observers = [
        {"name": "sentinel", "rules": rules or {}},
        {"name": "msprobe", "config_path": str(config), "stages": [STAGE], "steps": [1], "trigger": "anomaly"},
    ]
    with fresh_run(), verl_events.install({"save_path": str(save_path), "observers": observers}):
        for step in (1, 2, 3):
            worker.global_step = step
            with torch.no_grad():
                if change.get(step) == "nan":
                    worker.actor_module.fc1.weight[0, 0] = math.nan
                elif change.get(step) == "scale":
                    worker.actor_module.fc1.weight.mul_(1000)
            worker.flaky_calls = int(change.get(step) == "flaky")
            worker.compute_log_prob({"x": x})
    return save_path


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fc1's weight is NaN from step 2 on: reproducible."""
    return replay_run(tmp_path_factory.mktemp("nan") / "run", {2: "nan"})


@pytest.fixture(scope="module")
def flaky_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step 2's own call returns a NaN, its replay does not: transient."""
    return replay_run(tmp_path_factory.mktemp("flaky") / "run", {2: "flaky"})


def copy_run(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def triage_json(run: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["triage", str(run), "--json"]) == 1
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def labelled(out: str) -> dict[str, str]:
    """triage's lines by label (lines that start with a space continue the one before)."""
    return dict(line.split(None, 1) for line in out.splitlines() if line and not line[0].isspace())


def replays(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "replays.jsonl").read_text().splitlines()]


def holds_non_finite(dump_json: Path) -> bool:
    """Whether any statistic of any entry of an msprobe dump.json is NaN or infinite."""

    def values(value: Any) -> Iterator[float]:
        if isinstance(value, dict):
            yield from (value[s] for s in ("Max", "Min", "Mean", "Norm") if isinstance(value.get(s), float))
            for item in value.values():
                yield from values(item)
        elif isinstance(value, list):
            for item in value:
                yield from values(item)

    return any(not math.isfinite(v) for v in values(json.loads(dump_json.read_text())["data"]))


# -- in this process -------------------------------------------------------------------


def test_a_reproducible_anomaly_is_triaged_in_the_replay_dump_of_its_own_step(
    nan_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert [(r["step"], r["verdict"]) for r in replays(nan_run)] == [(2, "reproducible"), (3, "reproducible")]
    result = triage_json(nan_run, capsys)
    replay_dump = nan_run / "step_2" / REPLAY / "step0" / "rank0"
    # The next step's dump holds the NaN too: the replay's is read first.
    assert (nan_run / "step_3" / STAGE / "step0/rank0/dump.json").is_file()
    assert result["dump"] == str(replay_dump)
    op = result["op"]
    assert (op["op"], op["module"], op["parameter"]) == ("Functional.linear.0.forward", "fc1", "fc1.weight")
    assert op["parts"] == ["input_args.1 = fc1.weight", "output.0"]
    assert (op["source"]["file"], op["source"]["line"]) == (NET_FILE, forward_line())
    replay = result["replay"]
    assert (replay["verdict"], replay["step"], replay["stage"], replay["rank"]) == ("reproducible", 2, STAGE, 0)
    assert replay["meaning"] == "the inputs or the weights carry it"
    assert replay["dump"] == str(replay_dump) and replay["line"] == 1
    assert replay["inputs"] == str(nan_run / "step_2" / REPLAY / "inputs_rank0.pt")


def test_triage_prints_the_verdict_and_says_the_dump_is_the_anomalous_step(
    nan_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["triage", str(nan_run)]) == 1
    lines = labelled(capsys.readouterr().out)
    assert lines["replay"] == (
        "reproducible: old_log_probs/nonfinite_count 2 again with the same inputs and weights, "
        "so the inputs or the weights carry it"
    )
    assert lines["dump"] == f"{nan_run / 'step_2' / REPLAY / 'step0/rank0'}  (the replay: the anomalous step itself)"
    assert lines["inputs"].startswith(f"{nan_run / 'step_2' / REPLAY / 'inputs_rank0.pt'} (the stage's tensor inputs")
    assert lines["module"] == "fc1 (Module.fc1.Linear.forward.0)" and lines["param"] == "fc1.weight"


def test_a_transient_anomaly_names_the_kept_inputs_and_reads_the_next_steps(
    flaky_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replay_dump = flaky_run / "step_2" / REPLAY / "step0/rank0/dump.json"
    assert replay_dump.is_file() and not holds_non_finite(replay_dump)  # the replay ran clean
    result = triage_json(flaky_run, capsys)
    replay = result["replay"]
    assert (replay["verdict"], replay["again"]) == ("transient", {})
    assert replay["dump"] == str(replay_dump.parent)
    kept = torch.load(replay["inputs"])
    assert set(kept) == {"x"} and torch.equal(kept["x"], batch())  # the stage's input, as it was given
    assert result["dump"] is None and result["op"] is None
    assert result["reason"] == (
        "none of the 1 dump(s) after step 2 (steps 3) holds a NaN or Inf: "
        "the non-finite value did not recur in the dumped stages"
    )
    assert main(["triage", str(flaky_run)]) == 1
    lines = labelled(capsys.readouterr().out)
    assert lines["replay"] == (
        "transient: not reproduced with the same inputs and weights; suspect a nondeterministic kernel or the device"
    )
    assert lines["inputs"].startswith(f"{replay['inputs']} (")
    assert lines["origin"] == (
        "not captured: the replay of step 2 ran clean (the fault did not reproduce), "
        "so no dump holds the op that made it"
    )


def test_after_a_transient_replay_a_nan_in_a_later_dump_is_where_it_travelled_not_the_first_bad_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Step 2's own call goes NaN and its replay runs clean; fc1's weight is NaN from step 3 on.
    run = replay_run(tmp_path / "run", {2: "flaky", 3: "nan"})
    assert [(r["step"], r["verdict"]) for r in replays(run)] == [(2, "transient"), (3, "reproducible")]
    result = triage_json(run, capsys)
    assert result["replay"]["verdict"] == "transient"
    assert result["found"] is False and result["op"] is None  # step 3's NaN cannot be step 2's cause
    assert result["dump"] == str(run / "step_3" / STAGE / "step0/rank0")
    later = result["later_op"]
    assert (later["op"], later["module"], later["parameter"]) == ("Functional.linear.0.forward", "fc1", "fc1.weight")
    assert main(["triage", str(run)]) == 1
    out = capsys.readouterr().out
    lines = labelled(out)
    assert "op" not in lines and lines["origin"].startswith("not captured: the replay of step 2 ran clean")
    assert lines["later"] == (
        f"Functional.linear.0.forward  (the first with a NaN/Inf in step 3's {STAGE}: input_args.1 = fc1.weight, "
        "output.0): where the bad values travelled after step 2, not where they came from"
    )
    # The lines keep triage's order: the verdict, what it means for the dumps, then the later op.
    assert [line.split()[0] for line in out.splitlines() if line and not line[0].isspace()] == [
        "anomaly",
        "replay",
        "inputs",
        "origin",
        "dump",
        "later",
        "module",
        "param",
        "source",
    ]


def test_a_reproducible_spike_is_compared_from_the_replay_with_the_last_healthy_dump(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = replay_run(tmp_path / "run", {2: "scale"}, rules={"old_log_probs/abs_max": {"above": 10}})
    first = json.loads((run / "anomalies.jsonl").read_text().splitlines()[0])
    assert (first["step"], first["metric"], first["rule"]) == (2, "old_log_probs/abs_max", "above")
    result = triage_json(run, capsys)
    assert result["replay"]["verdict"] == "reproducible"
    assert result["healthy_dump"] == str(run / "step_1" / STAGE / "step0/rank0")
    assert result["dump"] == str(run / "step_2" / REPLAY / "step0/rank0")
    assert result["op"]["parameter"] == "fc1.weight"
    assert main(["triage", str(run)]) == 1
    assert labelled(capsys.readouterr().out)["dumps"] == (
        f"healthy {run / 'step_1' / STAGE / 'step0/rank0'}  ->  the replay {run / 'step_2' / REPLAY / 'step0/rank0'}"
    )


def test_a_replay_without_its_dump_falls_back_to_the_next_step_and_says_so(
    nan_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(nan_run, tmp_path)
    shutil.rmtree(run / "step_2" / REPLAY)
    result = triage_json(run, capsys)
    assert result["replay"]["verdict"] == "reproducible" and result["replay"]["dump"] is None
    assert result["dump"] == str(run / "step_3" / STAGE / "step0/rank0")  # a stage before its replay
    assert result["op"]["parameter"] == "fc1.weight"
    assert result["notes"] == [
        f"{run / 'replays.jsonl'}:1 names the replay's inputs {run / 'step_2' / REPLAY / 'inputs_rank0.pt'}, "
        "which is not there",
        f"the replay of step 2 has no msprobe dump in {run}/step_2/{REPLAY} "
        f"(msprobe was not armed for {STAGE}, or had no capture left)",
    ]


def test_a_reproducible_verdict_whose_replay_dump_holds_no_nan_goes_on_to_the_next_steps(
    flaky_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(flaky_run, tmp_path)
    # The flaky run's clean replay dump, with the verdict said the other way round.
    (line,) = (run / "replays.jsonl").read_text().splitlines()
    (run / "replays.jsonl").write_text(json.dumps(dict(json.loads(line), verdict="reproducible")) + "\n")
    result = triage_json(run, capsys)
    assert result["replay"]["verdict"] == "reproducible" and result["dump"] is None
    assert result["notes"] == [
        "the replay's dump names no op (the 1 replay dump(s) of step 2 hold no NaN or Inf); "
        "the dumps after step 2 follow"
    ]
    assert result["reason"].startswith("none of the 1 dump(s) after step 2 (steps 3) holds a NaN or Inf")


def test_only_a_replay_of_the_anomalys_step_stage_and_rank_counts_and_bad_lines_are_warned(
    nan_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(nan_run, tmp_path)
    mine, later = (run / "replays.jsonl").read_text().splitlines()
    other_rank = json.dumps(dict(json.loads(mine), rank=1))
    (run / "replays.jsonl").write_text("\n".join(["{nope", '{"verdict": "maybe"}', other_rank, later]) + "\n")
    assert main(["triage", str(run), "--json"]) == 1
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["replay"] is None
    assert result["dump"] == str(run / "step_3" / STAGE / "step0/rank0")  # as without a replay
    assert f"{run / 'replays.jsonl'}:1: not a JSON line (" in captured.err
    assert f"{run / 'replays.jsonl'}:2: not a replay record (it lacks stage, rank); skipped" in captured.err


# -- docs/sentinel.md's demo commands ------------------------------------------------------


def demo_block(inject: str) -> list[list[str]]:
    """The bash block of docs/sentinel.md whose demo command injects ``inject``."""
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", DOC, flags=re.S) if f"--inject {inject}\n" in b]
    assert len(blocks) == 1, f"docs/sentinel.md should show one demo with --inject {inject}"
    return [shlex.split(line) for line in blocks[0].splitlines() if line.strip()]


def shown_output(inject: str) -> str:
    """The first text block docs/sentinel.md shows after the demo block that injects ``inject``."""
    block = rf"```bash\n[^`]*--inject {re.escape(inject)}\n[^`]*```"
    [shown] = re.findall(rf"{block}.*?```text\n(.*?)```", DOC, flags=re.S)
    return str(shown)


def run_twice(commands: list[list[str]], cwd: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The block (a demo, then triage) run twice in a row; the second triage, and the
    folder it read as the doc names it (relative to ``cwd``: triage prints it so)."""
    for _ in (1, 2):
        done = [
            subprocess.run([verl_events_exe(), *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=600)
            for argv in commands
        ]
        assert [argv[:2] for argv in commands] == [["verl-events", "demo"], ["verl-events", "triage"]]
        assert [r.returncode for r in done] == [0, 1], done[0].stderr[-3000:] + done[1].stderr
    return done[1], Path(commands[1][2])


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    return tmp_path


@pytest.mark.slow
def test_the_demos_one_off_nan_replays_reproducible_and_triage_names_the_weights_op(workdir: Path) -> None:
    triage, shown = run_twice(demo_block("nan-once@3"), workdir)
    run = workdir / shown
    replay_dump = run / "step_3" / REPLAY / "step0/rank0"
    assert (replay_dump / "dump.json").is_file()
    assert sorted(p.relative_to(run).parts[0] for p in run.glob("step_*"))[0] == "step_3"  # no healthy step dumped
    assert [(r["step"], r["stage"], r["rank"], r["verdict"]) for r in replays(run)] == [(3, STAGE, 0, "reproducible")]
    lines = labelled(triage.stdout)
    assert lines["replay"].startswith("reproducible: old_log_probs/nonfinite_count ")
    assert lines["dump"] == f"{shown / 'step_3' / REPLAY / 'step0/rank0'}  (the replay: the anomalous step itself)"
    assert lines["op"].startswith("Functional.linear.") and "input_args.1 = blocks.1.mlp.0.weight" in lines["op"]
    assert lines["module"].startswith("blocks.1.mlp.0 ") and lines["param"] == "blocks.1.mlp.0.weight"
    assert re.match(r"\.\.\./verl_events/apps/demo/model\.py:\d+ in forward: .*self\.mlp\(", lines["source"])
    assert triage.stdout == shown_output("nan-once@3")  # the doc shows what happens


@pytest.mark.slow
def test_the_demos_flaky_nan_replays_transient_with_the_stages_tensors_kept(workdir: Path) -> None:
    triage, shown = run_twice(demo_block("nan-flaky@3"), workdir)
    run = workdir / shown
    [record] = replays(run)
    assert (record["step"], record["stage"], record["rank"], record["verdict"]) == (3, STAGE, 0, "transient")
    assert not holds_non_finite(run / "step_3" / REPLAY / "step0/rank0/dump.json")
    kept = torch.load(run / record["inputs"])
    assert all(isinstance(t, torch.Tensor) for t in kept.values()) and "sequences" in kept
    assert kept["sequences"].dtype == torch.int64 and kept["sequences"].dim() == 2  # the rollout's token ids
    # The stage's input, not its output: the replay ran on the batch as the stage got it.
    assert "old_log_prob" not in kept
    # Training went on with the stage's own NaN log-probs, never the replay's clean ones:
    # step 3's actor update sees them.
    updates = [json.loads(line) for line in (run / "anomalies.jsonl").read_text().splitlines()]
    assert any(a["step"] == 3 and a["stage"] == "actor_update" for a in updates), updates
    lines = labelled(triage.stdout)
    assert lines["replay"].startswith("transient: not reproduced with the same inputs and weights")
    assert lines["inputs"].startswith(f"{shown / record['inputs']} (")
    assert ".replay" not in lines["dump"]
    # The replay ran clean, so a NaN in a later dump is where it travelled: never named as the op.
    assert "op" not in lines and lines["origin"].startswith("not captured: the replay of step 3 ran clean")
    later_step = int(re.search(r"/step_(\d+)/", lines["dump"])[1])  # type: ignore[index]
    assert later_step > 3 and "not where they came from" in lines["later"]
    assert lines["module"] == "none: it ran outside every module's forward"  # the loss, in update_actor
    assert re.match(r"\.\.\./verl_events/apps/demo/model\.py:\d+ in update_actor: ", lines["source"])
    assert triage.stdout == shown_output("nan-flaky@3")  # the doc shows what happens


@pytest.mark.slow
def test_two_ranks_both_replay_the_last_ranks_fault_and_only_it_judges(workdir: Path) -> None:
    argv = ["demo", "--config", "examples/sentinel.yaml", "--inject", "nan-once@3", "--nproc", "2"]
    done = subprocess.run(
        [verl_events_exe(), *argv, "--save-path", "two"], cwd=workdir, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = workdir / "two"
    dumps = {rank: run / "step_3" / REPLAY / "step0" / f"rank{rank}" / "dump.json" for rank in (0, 1)}
    assert all(dump.is_file() for dump in dumps.values())
    assert holds_non_finite(dumps[1]) and not holds_non_finite(dumps[0])  # the fault is rank 1's alone
    assert [(r["step"], r["rank"], r["verdict"]) for r in replays(run)] == [(3, 1, "reproducible")]
    assert (run / "step_3" / REPLAY / "inputs_rank1.pt").is_file()
    assert not (run / "step_3" / REPLAY / "inputs_rank0.pt").exists()
    triage = subprocess.run(
        [verl_events_exe(), "triage", "two", "--json"], cwd=workdir, capture_output=True, text=True, timeout=120
    )
    assert triage.returncode == 1, triage.stderr
    result = json.loads(triage.stdout)
    assert result["dump"] == str(Path("two") / "step_3" / REPLAY / "step0/rank1")
    assert result["op"]["parameter"] == "blocks.1.mlp.0.weight"
