"""The mismatch observer on verl 0.9.1's real trainer: ``python -m verl.trainer.main_ppo`` under
Ray, FSDP2 on gloo, on CPU, with docs/mismatch.md's config and commands as written.

Three trainer runs of the tiny CPU job (verl_events.apps.verl_cpu.job), the trainer in float32:

- the doc's switch, twice in a row, with the rollout in bfloat16 (``rollout.dtype=bfloat16``):
  the mismatch docs/mismatch.md shows, from the tokens to the layer where it enters;
- once with the rollout in float32 too, on two FSDP ranks: identical settings, so tiny gaps,
  every layer within tolerance on both ranks, and verl's own ``training/rollout_probs_diff_*``
  (printed by the trainer for the whole batch) given back by pooling the ranks' records.

Each ``verl-events mismatch`` command of the doc runs twice in a row on each run.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.verl_cpu import job
from verl_events.observers.mismatch import MismatchRecord

from .support import REPO, doc_blocks, doc_commands, on

DOC = (REPO / "docs/mismatch.md").read_text()
FP32_TRAINER = (
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
)
BF16_ROLLOUT = "actor_rollout_ref.rollout.dtype=bfloat16"
TWO_RANKS = ["trainer.n_gpus_per_node=2", "+ray_kwargs.ray_init.num_gpus=2", "ray_kwargs.ray_init.num_cpus=16"]
# verl's console logger: "step:3 - key:value - ... " (a Ray prefix may precede it).
STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)")
TIMEOUT_S = 900
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]


@dataclass(frozen=True)
class Run:
    root: Path  # what /shared/ stands for
    save_path: Path
    log: str

    def records(self) -> list[MismatchRecord]:
        lines = (self.save_path / "mismatch.jsonl").read_text().splitlines()
        return [MismatchRecord.from_json(line) for line in lines]

    def console(self) -> dict[int, dict[str, float]]:
        """Each step's metrics as verl's console logger printed them."""
        steps: dict[int, dict[str, float]] = {}
        for match in STEP_LINE.finditer(self.log):
            pairs = (item.split(":", 1) for item in match.group(2).split(" - ") if ":" in item)
            steps[int(match.group(1))] = {key.strip(): float(value) for key, value in pairs if _number(value)}
        return steps


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def run_doc_switch(root: Path, files: job.JobFiles, name: str, extra: list[str]) -> Run:
    """docs/mismatch.md's config and main_ppo command on the tiny job, ``extra`` overrides added."""
    config = next(b for b in doc_blocks("yaml", DOC) if "# /shared/mismatch.yaml" in b)
    (root / "mismatch.yaml").write_text(on(root, config))
    if not (root / "model").exists():
        (root / "model").symlink_to(files.model)  # the doc's --tokenizer /shared/model
    (switch,) = doc_commands("mismatch.yaml", doc=DOC)
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {k: on(root, v) for k, v in switch.env.items()}
    doc_args = [on(root, arg) for arg in switch.argv[3:]]
    overrides = job.merge_overrides(job.trainer_args(files, steps=3), [*doc_args, *extra])
    log = root / f"{name}.log"
    code = job.run_trainer(overrides, env, log=log, timeout=TIMEOUT_S)
    text = log.read_text()
    assert code == 0, f"{name}: main_ppo exited {code}:\n{text[-6000:]}"
    latest = root / "mismatch/latest"  # the doc's commands read the run through it
    assert latest.is_symlink() and (latest / "run.json").is_file(), f"{name}: {latest} is no link to the run"
    return Run(root, latest.resolve(), text)


def doc_mismatch_commands(root: Path) -> list[list[str]]:
    """The doc's ``verl-events mismatch`` commands, /shared/ pointing into ``root``."""
    lines = [line for block in doc_blocks("bash", DOC) for line in block.splitlines()]
    commands = [on(root, line).split()[1:] for line in lines if line.startswith("verl-events mismatch ")]
    assert len(commands) == 4, lines
    return commands


def twice(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``verl-events ARGV`` twice in a row; both exit 0 and print the same; return it."""
    outputs = []
    for _ in range(2):
        assert verl_events_main(argv) == 0, capsys.readouterr().err
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    return outputs[0]


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run]:
    files = job.prepare(tmp_path_factory.mktemp("mismatch-job"))
    root = tmp_path_factory.mktemp("mismatch")
    first = run_doc_switch(root, files, "first", [FP32_TRAINER, BF16_ROLLOUT])
    second = run_doc_switch(root, files, "second", [FP32_TRAINER, BF16_ROLLOUT])
    return first, second


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Run:
    files = job.prepare(tmp_path_factory.mktemp("healthy-mismatch-job"))
    return run_doc_switch(tmp_path_factory.mktemp("healthy-mismatch"), files, "healthy", [FP32_TRAINER, *TWO_RANKS])


def test_the_doc_switch_runs_twice_in_a_row_each_run_in_its_own_folder(bf16: tuple[Run, Run]) -> None:
    first, second = bf16
    assert first.save_path != second.save_path
    assert first.save_path.parent == second.save_path.parent == first.root / "mismatch"  # latest: the second
    for run in bf16:
        found = run.records()
        assert [(r.step, r.rank) for r in found] == [(1, 0), (2, 0), (3, 0)]
        assert len({r.run for r in found}) == 1 and all(r.stats is not None for r in found)
        # verl's sync mode: each step's rollout sampled with the weights the trainer recomputes with.
        assert [r.weights for r in found] == [
            {"trainer": s - 1, "rollout_min": s - 1, "rollout_max": s - 1} for s in (1, 2, 3)
        ]
        dumps = sorted(str(p.relative_to(run.save_path)) for p in run.save_path.rglob("dump.json"))
        assert dumps == [
            f"step_2/{stage}/step0/rank0/dump.json" for stage in ("actor_compute_log_prob", "rollout_prefill")
        ]


def test_a_bfloat16_rollout_shows_larger_gaps_and_its_worst_tokens_decoded(
    bf16: tuple[Run, Run], healthy: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    healthy_means = [r.stats["log_prob"]["mean"] for r in healthy.records() if r.stats]
    for run in bf16:
        means = [r.stats["log_prob"]["mean"] for r in run.records() if r.stats]
        assert min(means) > 10 * max(healthy_means), (means, healthy_means)
        assert all(len(r.stats["top"]) == 8 for r in run.records() if r.stats)

        tokens, _, _, _ = doc_mismatch_commands(run.root)
        text = twice(tokens, capsys)
        assert "3 step(s), 1 rank(s)" in text and "worst tokens:" in text
        worst = json.loads(twice([*tokens, "--json"], capsys))["worst"]
        assert len(worst) == 10 and all("text" in token for token in worst)
        assert abs(worst[0]["delta"]) == max(r.stats["log_prob"]["max"] for r in run.records() if r.stats)


def test_the_layer_profile_names_where_the_bfloat16_error_enters_and_how_it_grows(
    bf16: tuple[Run, Run], capsys: pytest.CaptureFixture[str]
) -> None:
    for run in bf16:
        _, layers, _, _ = doc_mismatch_commands(run.root)
        text = twice(layers, capsys)
        assert "the error enters at model.embed_tokens" in text
        profile = json.loads(twice([*layers, "--json"], capsys))
        rows = {row["module"]: row for row in profile["modules"] if row["layer"]}
        assert list(rows) == [
            "model.embed_tokens",
            "model.rotary_emb",
            "model.layers.0",
            "model.layers.1",
            "model.norm",
        ]
        assert profile["first_past_tolerance"] == "model.embed_tokens"
        # bfloat16's rounding enters with the embedding and grows through the decoder layers.
        assert rows["model.layers.0"]["error"] > rows["model.embed_tokens"]["error"] > profile["tolerance"]
        assert rows["model.norm"]["error"] > profile["tolerance"]
        assert profile["grows_most"] in ("model.layers.0", "model.layers.1")


def test_the_docs_plots_are_drawn(bf16: tuple[Run, Run], capsys: pytest.CaptureFixture[str]) -> None:
    run = bf16[1]
    _, _, steps_plot, layers_plot = doc_mismatch_commands(run.root)
    for argv in (steps_plot, layers_plot):
        twice(argv, capsys)
        picture = Path(argv[argv.index("--plot") + 1])
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_identical_settings_on_two_ranks_give_verls_own_numbers_and_tiny_gaps(healthy: Run) -> None:
    found = healthy.records()
    assert sorted((r.step, r.rank) for r in found) == [(s, r) for s in (1, 2, 3) for r in (0, 1)]
    console = healthy.console()
    for step in (1, 2, 3):
        ranks = [r.stats for r in found if r.step == step and r.stats]
        verls = console[step]
        # verl's numbers are over the whole batch; each rank had its half.
        assert max(s["verl"]["probs_diff_max"] for s in ranks) == pytest.approx(
            verls["training/rollout_probs_diff_max"], rel=1e-5
        )
        pooled_mean = sum(s["verl"]["probs_diff_mean"] * s["tokens"] for s in ranks) / sum(s["tokens"] for s in ranks)
        assert pooled_mean == pytest.approx(verls["training/rollout_probs_diff_mean"], rel=1e-4)
        # float32 on both sides: the gap is the rollout's incremental decoding against one prefill.
        assert max(s["log_prob"]["max"] for s in ranks) < 1e-4


def test_identical_settings_are_within_tolerance_at_every_layer_on_both_ranks(
    healthy: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    _, layers, _, _ = doc_mismatch_commands(healthy.root)
    for rank in (0, 1):
        profile = json.loads(twice([*layers, "--rank", str(rank), "--json"], capsys))
        assert profile["first_past_tolerance"] is None
        assert all(row["error"] <= profile["tolerance"] for row in profile["modules"])
        assert f"/rank{rank}/" in profile["engine"]


def test_what_the_observer_costs_a_step(healthy: Run) -> None:
    """Printed for docs/performance.md: the observer's hooks at actor_compute_log_prob against
    verl's own step time (timing_s/step), on the steps without the engine prefill."""
    timing = [json.loads(line) for line in (healthy.save_path / "timing/rank0.jsonl").read_text().splitlines()]
    console = healthy.console()
    for record in timing:
        if record["stage"] == "actor_compute_log_prob" and record["step"] != 2:
            hook = record["hook_s"]["mismatch"]
            step = console[record["step"]]["timing_s/step"]
            print(f"step {record['step']}: mismatch {hook * 1e3:.2f} ms of a {step:.2f} s step ({hook / step:.3%})")
            assert hook > 0
