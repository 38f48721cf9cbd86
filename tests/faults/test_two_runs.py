"""Two runs started together on one save_path.

Two drivers with their own VERL_EVENTS_RUN_ID both install (each sees an
empty save_path), then train on the test's word: ``at once``, or ``one
ahead``: run-alpha first, up to the middle of step 1's actor_update, then
all of run-beta, then the rest of run-alpha.  Their inputs differ in batch
size (4 and 6), which every dump entry's shape shows, so each dump.json
tells which run wrote it.  One run may keep the save_path (in ``one
ahead``, run-alpha, which wrote first); the other must write nothing there,
and say so.  Besides msprobe and timing, each run has two more observers that
write under save_path (``--writers``): torch.profiler and a third-party one;
their files too must all be the owner's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .processes import Child, driver, entries, log_records, marker

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

BATCH = {"run-alpha": 4, "run-beta": 6}
SESSIONS = [
    f"step_{step}/{stage}/step0/rank0" for step in (1, 2) for stage in ("actor_compute_log_prob", "actor_update")
]


@dataclass(frozen=True)
class TwoRuns:
    save_path: Path
    children: dict[str, Child]
    returncodes: dict[str, int]
    may_own: frozenset[str]  # the runs that may end up owning the save_path

    @property
    def owner(self) -> str:
        owner: str = json.loads((self.save_path / "run.json").read_text(encoding="utf-8"))["run_id"]
        return owner


@pytest.fixture(scope="module", params=["at once", "one ahead"])
def two_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TwoRuns:
    save_path = tmp_path_factory.mktemp("shared") / "run"
    ahead = request.param == "one ahead"
    pause = {"run-alpha": ["--pause", "1:0"] if ahead else [], "run-beta": []}
    children = {
        run: driver(
            save_path, "--hold", "--writers", "--batch", str(batch), *pause[run], env={"VERL_EVENTS_RUN_ID": run}
        )
        for run, batch in BATCH.items()
    }
    for child in children.values():
        child.wait_for("INSTALLED")
    alpha, beta = children["run-alpha"], children["run-beta"]
    if ahead:
        alpha.go_on()
        alpha.wait_for("IN STAGE")
        beta.go_on()
        beta.finish()
        alpha.go_on()
    else:
        alpha.go_on()
        beta.go_on()
    returncodes = {run: child.finish() for run, child in children.items()}
    return TwoRuns(save_path, children, returncodes, frozenset({"run-alpha"} if ahead else BATCH))


def batches(dump: dict[str, Any]) -> set[int]:
    """The batch sizes in a dump: the first dimension of every 2-D output."""
    return {
        output["shape"][0]
        for entry in dump.values()
        for output in entry.get("output", [])
        if isinstance(output, dict) and len(output.get("shape", [])) == 2
    }


def test_both_runs_finish(two_runs: TwoRuns) -> None:
    for run, child in two_runs.children.items():
        assert two_runs.returncodes[run] == 0, child.stderr
        assert child.stdout.endswith("TRAINING FINISHED\n")


def test_no_dump_json_holds_data_of_both_runs(two_runs: TwoRuns) -> None:
    dumps = sorted(two_runs.save_path.rglob("dump.json"))
    assert dumps
    for path in dumps:
        assert len(batches(entries(path.parent))) == 1, path


def test_the_run_that_wrote_first_keeps_the_save_path(two_runs: TwoRuns) -> None:
    assert two_runs.owner in two_runs.may_own


def test_every_dump_belongs_to_the_run_named_in_run_json(two_runs: TwoRuns) -> None:
    owner = two_runs.owner
    written = {
        str(path.parent.relative_to(two_runs.save_path)): batches(entries(path.parent))
        for path in two_runs.save_path.rglob("dump.json")
    }
    assert written == {rank_dir: {BATCH[owner]} for rank_dir in SESSIONS}, f"run.json names {owner}"
    for rank_dir in SESSIONS:
        assert marker(two_runs.save_path / rank_dir) is None


def test_no_timing_log_holds_records_of_both_runs(two_runs: TwoRuns) -> None:
    logs = sorted((two_runs.save_path / "timing").glob("rank*.jsonl"))
    assert logs
    for log in logs:
        runs = [json.loads(line)["run"] for line in log.read_text(encoding="utf-8").splitlines()]
        assert set(runs) == {two_runs.owner}, f"{log} holds {len(runs)} records: " + ", ".join(
            f"{runs.count(r)} of {r}" for r in sorted(set(runs))
        )
        assert len(runs) == 2 * 3  # every stage of the owner, none lost


def test_only_the_run_that_lost_the_save_path_logs_refusals(two_runs: TwoRuns) -> None:
    owner = two_runs.owner
    (loser,) = set(BATCH) - {owner}
    owner_errors = [r for r in log_records(two_runs.children[owner].stderr) if r.startswith("ERROR")]
    assert owner_errors == [], f"the run that owns the save_path ({owner}) logged refusals"
    loser_errors = [r for r in log_records(two_runs.children[loser].stderr) if r.startswith("ERROR")]
    assert any("'msprobe'" in r for r in loser_errors) and any("'timing'" in r for r in loser_errors), (
        f"{loser} wrote nothing of its own but did not say so for both observers"
    )


def test_the_other_writers_files_belong_to_the_owner_alone(two_runs: TwoRuns) -> None:
    owner = two_runs.owner
    stages = ["actor_compute_log_prob", "compute_values", "actor_update"]
    notes = {
        str(path.relative_to(two_runs.save_path)): path.read_text(encoding="utf-8").split()
        for path in two_runs.save_path.rglob("note_rank*.txt")
    }
    assert notes == {f"step_{step}/{stage}/note_rank0.txt": [owner] for step in (1, 2) for stage in stages}
    traces = sorted(str(p.relative_to(two_runs.save_path)) for p in two_runs.save_path.rglob("torch_profiler_*"))
    assert traces == [
        f"step_{step}/compute_values/torch_profiler_step_{step}_compute_values_rank0.pt.trace.json" for step in (1, 2)
    ]
