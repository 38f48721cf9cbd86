"""The mismatch observer and ``verl-events mismatch`` on real torch, real verl tensors and real msprobe dumps.

verl's trainer end to end is tests/test_verl_mismatch.py; here each piece on its own:
the token statistics against verl's ``calculate_debug_metrics`` and against plain torch on
the same tensors (padded and verl 0.9's no-padding layout), the observer through a real
installation, the command's output and its bad input, and the layer profile from two real
msprobe tensor dumps of a small model, one side in bfloat16.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
pytest.importorskip("msprobe")  # the layer profile's dumps are real msprobe dumps

import yaml
from tensordict import TensorDict
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.utils.debug.metrics import calculate_debug_metrics

import verl_events
from verl_events import ConfigError, stage
from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.mismatch.layers import layer_profile
from verl_events.apps.mismatch.summary import MismatchInputError
from verl_events.observers.mismatch import MismatchObserver, MismatchRecord, sampled_sequences
from verl_events.observers.mismatch.tokens import ENTROPY_EDGES, StepTokens, measure, step_tokens

from .mismatch_models import Tiny, dump_both_sides, random_gap
from .observers.verl_batches import engine_inputs, nested_like, padded_batch
from .support import REPO, doc_blocks

DOC = (REPO / "docs/mismatch.md").read_text()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")


# -- the numbers ---------------------------------------------------------------


def test_verls_own_rollout_probs_diff_numbers_are_given_on_the_same_tensors() -> None:
    old, rollout = random_gap(shape=(4, 6))
    batch = padded_batch()  # 3 rows: a fourth shares the mask of the second
    mask = torch.cat([batch.batch["response_mask"], batch.batch["response_mask"][1:2]])
    responses = torch.cat([batch.batch["responses"], batch.batch["responses"][1:2]])
    mask, responses = torch.nn.functional.pad(mask, (0, 2)), torch.nn.functional.pad(responses, (0, 2))
    tensors = {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask, "responses": responses}
    verls = calculate_debug_metrics(DataProto.from_dict(tensors))

    ours = measure(step_tokens(tensors, tensors), top_k=3)["verl"]  # type: ignore[arg-type]

    assert ours["valid"] == verls["training/rollout_probs_diff_valid"] == 1
    for name in ("probs_diff_max", "probs_diff_mean", "probs_diff_std"):
        assert ours[name] == pytest.approx(verls[f"training/rollout_{name}"], rel=1e-6), name
    assert ours["pearson_corr"] == pytest.approx(verls["training/rollout_actor_probs_pearson_corr"], rel=1e-6)


def test_quantiles_bins_sequence_sums_and_worst_tokens_are_those_of_the_response_tokens() -> None:
    old, rollout = random_gap(seed=1, shape=(3, 4))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    entropy = torch.tensor([[0.005, 0.3, 9.0, 9.0], [1.5, 3.0, 5.0, 0.05], [0.7, 9.0, 9.0, 9.0]])
    tokens = torch.arange(12).reshape(3, 4)
    old[0, 3] = -90.0  # padding: never counted
    batch = {"old_log_probs": old, "entropys": entropy}
    inputs = {"rollout_log_probs": rollout, "response_mask": mask.long(), "responses": tokens}

    stats = measure(step_tokens(batch, inputs), top_k=3)  # type: ignore[arg-type]

    gap = (old.double() - rollout.double()).abs()
    kept = gap[mask]
    assert stats["tokens"] == 7 and stats["nonfinite"] == 0
    assert stats["log_prob"]["max"] == pytest.approx(kept.max().item())
    assert stats["log_prob"]["mean"] == pytest.approx(kept.mean().item())
    assert stats["log_prob"]["p90"] == pytest.approx(torch.quantile(kept, 0.9).item())
    prob_gap = (old.double().exp() - rollout.double().exp()).abs()[mask]
    assert stats["prob"]["max"] == pytest.approx(prob_gap.max().item())
    # Positions: 4 columns, one bin each.
    assert [b["tokens"] for b in stats["by_position"]] == [3, 2, 1, 1]
    assert stats["by_position"][0]["max"] == pytest.approx(gap[:, 0].max().item())
    # Entropy: each response token in its bin, the last one open-ended.
    counts = {(b["low"], b["high"]): b["tokens"] for b in stats["by_entropy"]}
    assert sum(counts.values()) == 7 and len(counts) == len(ENTROPY_EDGES) - 1
    assert counts[(0.0, 0.01)] == 1 and counts[(0.01, 0.1)] == 1 and counts[(4.0, None)] == 1
    sums = torch.where(mask, old.double() - rollout.double(), 0.0).sum(dim=1)
    assert stats["sequence"]["max"] == pytest.approx(sums.max().item())
    assert stats["sequence"]["worst"] == int(sums.abs().argmax())
    top = stats["top"]
    assert [abs(t["old"] - t["rollout"]) for t in top] == sorted(
        (abs(t["old"] - t["rollout"]) for t in top), reverse=True
    )
    first = top[0]
    assert abs(first["old"] - first["rollout"]) == pytest.approx(kept.max().item(), rel=1e-6)
    assert first["token"] == int(tokens[first["sample"], first["position"]])
    assert first["entropy"] == pytest.approx(float(entropy[first["sample"], first["position"]]))


def test_verl_engine_workers_nested_log_probs_give_the_padded_layouts_numbers() -> None:
    rollout = torch.tensor([[-1.0, -1.5, 0.0, 0.0], [-2.0, -2.5, -0.5, -1.0], [-4.0, 0.0, 0.0, 0.0]])
    data = engine_inputs(padded_batch(rollout_log_probs=rollout), calculate_entropy=True)
    total = data["input_ids"].values().shape[0]
    log_probs = nested_like(data, -torch.arange(total, dtype=torch.float32) / 7)
    result = tu.get_tensordict(
        tensor_dict={"log_probs": log_probs, "entropy": nested_like(data, torch.full((total,), 0.5))},
        non_tensor_dict={"metrics": {}},
    )
    from verl.workers.utils.padding import no_padding_2_padding

    aligned = no_padding_2_padding(log_probs, data)  # verl's own alignment
    padded = {"old_log_probs": aligned, "rollout_log_probs": rollout, "response_mask": data["response_mask"]}

    nested_stats = measure(step_tokens(result, data), top_k=2)  # type: ignore[arg-type]
    padded_stats = measure(step_tokens(padded, padded), top_k=2)  # type: ignore[arg-type]

    assert nested_stats["tokens"] == 7
    assert nested_stats["log_prob"] == pytest.approx(padded_stats["log_prob"])
    assert nested_stats["verl"] == pytest.approx(padded_stats["verl"])
    assert [(t["sample"], t["position"], t["token"]) for t in nested_stats["top"]] == [
        (t["sample"], t["position"], int(data["responses"][t["sample"], t["position"]])) for t in padded_stats["top"]
    ]


def test_verls_v1_trainer_jagged_responses_give_verls_own_numbers() -> None:
    """verl's default (v1) trainer hands the stage TransferQueue's layout: every response
    tensor jagged, a row per response, and the actor's log-probs in bfloat16.  The stage's
    own tensors give verl's figures as its v1 trainer computes them
    (trainer/ppo/v1/trainer_base.py: response_from_nested, to_padded_tensor, then
    calculate_debug_metrics), and the padded layout's statistics."""
    from verl.workers.utils.padding import response_from_nested

    rows = [torch.tensor([-1.0, -1.5]), torch.tensor([-2.0, -2.5, -0.5, -1.0]), torch.tensor([-4.0])]
    padded_rollout = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    data = engine_inputs(padded_batch(rollout_log_probs=padded_rollout), calculate_entropy=True)
    jagged = functools.partial(torch.nested.as_nested_tensor, layout=torch.jagged)
    tokens = [torch.tensor([21, 22]), torch.tensor([23, 24, 25, 26]), torch.tensor([27])]
    data["rollout_log_probs"] = jagged(rows)
    data["response_mask"] = jagged([torch.ones(len(row), dtype=torch.long) for row in rows])
    data["responses"] = jagged(tokens)
    total = data["input_ids"].values().shape[0]
    log_probs = nested_like(data, -torch.arange(total, dtype=torch.float32) / 7).to(torch.bfloat16)
    result = tu.get_tensordict(tensor_dict={"log_probs": log_probs}, non_tensor_dict={"metrics": {}})
    theirs = TensorDict(
        {
            "old_log_probs": response_from_nested(log_probs, data["response_mask"]),
            "rollout_log_probs": data["rollout_log_probs"],
            "response_mask": data["response_mask"],
            "responses": data["responses"],
        },
        batch_size=[3],
    ).to_padded_tensor()
    verls = calculate_debug_metrics(DataProto(batch=theirs))

    stats = measure(step_tokens(result, data), top_k=2)  # type: ignore[arg-type]

    assert stats["tokens"] == 7
    for name in ("probs_diff_max", "probs_diff_mean", "probs_diff_std"):
        assert stats["verl"][name] == verls[f"training/rollout_{name}"], name  # the same arithmetic
    assert stats["verl"]["pearson_corr"] == pytest.approx(verls["training/rollout_actor_probs_pearson_corr"], rel=1e-6)
    padded = {"old_log_probs": theirs["old_log_probs"], "rollout_log_probs": padded_rollout}
    padded |= {"response_mask": theirs["response_mask"], "responses": theirs["responses"]}
    assert stats["log_prob"] == pytest.approx(measure(step_tokens(padded, padded), top_k=2)["log_prob"])  # type: ignore[arg-type]
    assert [t["token"] for t in stats["top"]] == [
        int(theirs["responses"][t["sample"], t["position"]]) for t in stats["top"]
    ]


def test_the_reference_computed_by_the_lora_actor_is_not_compared() -> None:
    """verl 0.9 runs the LoRA reference through actor_compute_log_prob with calculate_entropy=False:
    those log-probs are the reference's, not the actor's."""
    rollout = torch.full((3, 4), -1.0)
    data = engine_inputs(padded_batch(rollout_log_probs=rollout), calculate_entropy=False)
    total = data["input_ids"].values().shape[0]
    result = tu.get_tensordict(tensor_dict={"log_probs": nested_like(data, torch.zeros(total))}, non_tensor_dict={})
    assert step_tokens(result, data) is None
    assert isinstance(step_tokens(result, engine_inputs(padded_batch(rollout_log_probs=rollout))), StepTokens)


def test_non_finite_tokens_are_counted_and_left_out_of_the_statistics() -> None:
    old, rollout = random_gap(seed=2)
    old[1, 2] = math.nan
    rollout[2, 0] = -math.inf
    stats = measure(step_tokens({"old_log_probs": old}, {"rollout_log_probs": rollout}), top_k=12)  # type: ignore[arg-type]

    assert stats["tokens"] == 10 and stats["nonfinite"] == 2
    assert math.isfinite(stats["log_prob"]["max"]) and len(stats["top"]) == 10
    assert math.isnan(stats["verl"]["probs_diff_mean"])  # verl's own numbers include them, as verl does


def test_what_is_missing_is_said() -> None:
    old, rollout = random_gap()
    assert step_tokens({"old_log_probs": old}, {}) == "the batch carries no rollout_log_probs"
    assert "no old_log_probs" in str(step_tokens({"entropys": old}, {"rollout_log_probs": rollout}))
    assert "not a batch" in str(step_tokens(3.0, None))
    assert "do not cover the same" in str(step_tokens({"old_log_probs": old[:, :2]}, {"rollout_log_probs": rollout}))


def test_the_sequences_for_the_engine_drop_the_padding() -> None:
    batch = padded_batch().batch
    assert sampled_sequences(dict(batch.items())) == [
        [11, 12, 21, 22],
        [13, 14, 15, 23, 24, 25, 26],
        [16, 17, 18, 19, 27],
    ]
    assert sampled_sequences({"prompts": batch["prompts"]}) == []


def test_the_sequences_for_the_engine_from_verls_v1_jagged_rows_are_each_rows_prompt_and_response() -> None:
    """verl's v1 trainer hands prompts and responses as jagged tensors, unpadded, with no
    attention_mask of the padded shape: the same sequences as the padded batch above."""
    jagged = functools.partial(torch.nested.as_nested_tensor, layout=torch.jagged)
    prompts = jagged([torch.tensor([11, 12]), torch.tensor([13, 14, 15]), torch.tensor([16, 17, 18, 19])])
    responses = jagged([torch.tensor([21, 22]), torch.tensor([23, 24, 25, 26]), torch.tensor([27])])
    assert sampled_sequences({"prompts": prompts, "responses": responses}) == [
        [11, 12, 21, 22],
        [13, 14, 15, 23, 24, 25, 26],
        [16, 17, 18, 19, 27],
    ]


# -- the observer --------------------------------------------------------------


def log_prob_stage(step: int, old: torch.Tensor, inputs: dict[str, torch.Tensor]) -> None:
    call = stage("actor_compute_log_prob", step=step, inputs=inputs)
    with call:
        call.set_result({"old_log_probs": old})


def records(save_path: Path) -> list[MismatchRecord]:
    return [MismatchRecord.from_json(line) for line in (save_path / "mismatch.jsonl").read_text().splitlines()]


@pytest.fixture
def watched(tmp_path: Path) -> Path:
    """Three steps watched by the mismatch observer, the gap doubling each step."""
    save_path = tmp_path / "run"
    with verl_events.install({"save_path": str(save_path), "observers": [{"name": "mismatch", "top_k": 2}]}):
        for step in (1, 2, 3):
            old, rollout = random_gap(seed=step)
            old = rollout + (old - rollout) * 2**step
            log_prob_stage(step, old, {"rollout_log_probs": rollout, "responses": torch.arange(12).reshape(3, 4)})
        with stage("actor_update", step=3):  # not watched: no line
            pass
    return save_path


def test_one_line_per_step_and_rank_with_the_top_k_tokens(watched: Path) -> None:
    found = records(watched)
    assert [(r.step, r.rank, r.stage) for r in found] == [(s, 0, "actor_compute_log_prob") for s in (1, 2, 3)]
    assert all(r.stats is not None and r.stats["tokens"] == 12 and len(r.stats["top"]) == 2 for r in found)


def test_the_command_shows_steps_trend_bins_and_worst_tokens_the_same_twice(
    watched: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = []
    for _ in range(2):
        assert verl_events_main(["mismatch", str(watched), "--top", "3"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    text = outputs[0]
    assert "3 step(s), 1 rank(s), 36 response tokens" in text
    assert "by response position" in text and "worst tokens" in text
    assert "trend: mean |Δ log p|" in text and "at step 3" in text
    assert "scale: a mean |Δ log p| of " in text and "PPO's clip (ε = 0.2) is |Δ| = 0.182" in text

    assert verl_events_main(["mismatch", str(watched), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [row["step"] for row in result["trend"]] == [1, 2, 3]
    means = [row["mean"] for row in result["trend"]]
    assert means[0] < means[1] < means[2]
    worst = result["worst"]
    assert len(worst) == 6 and worst[0]["step"] == 3 and abs(worst[0]["delta"]) == result["trend"][2]["max"]


def test_plot_writes_the_picture_and_names_it_last(
    watched: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    picture = tmp_path / "mismatch.png"
    assert verl_events_main(["mismatch", str(watched), "--plot", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.splitlines()[-1] == f"plot: {picture}"
    picture.unlink()
    # With --json, stdout stays one JSON document and the file is named on stderr.
    assert verl_events_main(["mismatch", str(watched), "--json", "--plot", str(picture)]) == 0
    output = capsys.readouterr()
    assert json.loads(output.out)["trend"] and output.err == f"plot: {picture}\n"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert verl_events_main(["mismatch", str(watched), "--plot", str(tmp_path / "x.txt")]) == 2
    assert "--plot" in capsys.readouterr().err


def test_a_run_without_rollout_log_probs_names_the_setting_that_fills_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_path = tmp_path / "run"
    with verl_events.install({"save_path": str(save_path), "observers": [{"name": "mismatch"}]}):
        log_prob_stage(1, torch.zeros(2, 3), {"responses": torch.zeros(2, 3, dtype=torch.long)})
    (record,) = records(save_path)
    assert record.stats is None and record.missing == "the batch carries no rollout_log_probs"

    assert verl_events_main(["mismatch", str(save_path)]) == 2
    error = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.calculate_log_probs=True" in error and "step(s) 1" in error


def test_a_batch_that_is_no_batch_is_said_without_the_setting_that_fills_rollout_log_probs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The setting is advice for one reason only: a stage that returned something else (as
    verl's v1 stages did before the bridge moved inside TransferQueue's) is another matter."""
    save_path = tmp_path / "run"
    with verl_events.install({"save_path": str(save_path), "observers": [{"name": "mismatch"}]}):
        call = stage("actor_compute_log_prob", step=1, inputs={"rollout_log_probs": torch.zeros(2, 3)})
        with call:
            call.set_result(["not", "a", "batch"])

    assert verl_events_main(["mismatch", str(save_path)]) == 2
    error = capsys.readouterr().err
    assert "at step(s) 1, the stage returned a list, not a batch of tensors" in error
    assert "calculate_log_probs" not in error and "bypass_mode" not in error


def v1_inputs(step: int, versions: list[tuple[int, int]], rollout: torch.Tensor) -> TensorDict:
    """A v1 batch as TransferQueue hands it: each row's weight versions in ``extra_fields``."""
    extra = [{"global_steps": low, "min_global_steps": low, "max_global_steps": high} for low, high in versions]
    return tu.get_tensordict(
        tensor_dict={"rollout_log_probs": rollout, "responses": torch.zeros_like(rollout, dtype=torch.long)},
        non_tensor_dict={"extra_fields": extra, "global_steps": [step] * len(versions)},
    )


def test_each_line_says_which_weight_versions_it_compares_and_the_command_flags_older_rollouts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl's asynchronous modes: step 2's rollouts sampled with the weights of sync 0 while the
    trainer holds version 1 (verl's trajectory_staleness 1); at step 3 one row spans two versions."""
    save_path = tmp_path / "run"
    old, rollout = random_gap(shape=(2, 3))
    with verl_events.install({"save_path": str(save_path), "observers": [{"name": "mismatch"}]}):
        for step, versions in ((1, [(0, 0), (0, 0)]), (2, [(0, 0), (0, 0)]), (3, [(1, 1), (0, 1)])):
            log_prob_stage(step, old, v1_inputs(step, versions, rollout))  # type: ignore[arg-type]
        log_prob_stage(4, old, {"rollout_log_probs": rollout})  # no tags: the legacy trainer, the demo

    found = records(save_path)
    assert [r.weights for r in found] == [
        {"trainer": 0, "rollout_min": 0, "rollout_max": 0},
        {"trainer": 1, "rollout_min": 0, "rollout_max": 0},
        {"trainer": 2, "rollout_min": 0, "rollout_max": 1},
        None,
    ]
    assert verl_events_main(["mismatch", str(save_path)]) == 0
    text = capsys.readouterr().out
    table = text.split("\n\n")[1].splitlines()
    assert table[1].split()[-1] == "weights"
    assert [line.split("  ")[-1].strip() for line in table[2:]] == ["same", "1 behind", "1-2 behind", "-"]
    assert "older weights: at step(s) 2, 3 the rollout sampled with weights older than the trainer's" in text
    assert verl_events_main(["mismatch", str(save_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"][1]["weights"] == found[1].weights


@pytest.mark.parametrize(
    "weights",
    [
        {"trainer": 1},
        {"trainer": 1, "rollout_min": 0, "rollout_max": "0"},
        [1, 0, 0],
        {"trainer": True, "rollout_min": 0, "rollout_max": 0},
    ],
)
def test_a_line_whose_weights_are_not_three_whole_numbers_is_not_a_record(weights: object) -> None:
    line = json.dumps(
        {"run": "r", "step": 1, "stage": "actor_compute_log_prob", "rank": 0, "time": 1.0, "weights": weights}
    )
    with pytest.raises(ValueError, match="its weights are not a mapping of trainer, rollout_min, rollout_max"):
        MismatchRecord.from_json(line)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--top", "-1"], "--top -1"),
        (["--tolerance", "0"], "--tolerance 0"),
        (["--modules"], "--modules applies to --layers STEP's profile; add --layers STEP"),
        (["--rank", "1"], "--rank applies to --layers STEP's profile"),
        (["--tolerance", "0.01"], "--tolerance applies to --layers STEP's profile"),
        (["--layers", "1", "--tokenizer", "x"], "--tokenizer is for the worst tokens"),
        (["--layers", "1", "--top", "3"], "--top is for the worst tokens"),
    ],
)
def test_bad_arguments_exit_2_with_a_sentence(
    watched: Path, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verl_events_main(["mismatch", str(watched), *argv]) == 2
    assert said in capsys.readouterr().err


def test_a_run_the_observer_never_watched_and_a_missing_folder_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verl_events_main(["mismatch", str(tmp_path)]) == 2
    assert "add '- name: mismatch'" in capsys.readouterr().err
    assert verl_events_main(["mismatch", str(tmp_path / "nowhere")]) == 2
    assert "does not exist; pass the save_path of a run" in capsys.readouterr().err


def test_a_tokenizer_path_that_does_not_load_exits_2(
    watched: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verl_events_main(["mismatch", str(watched), "--tokenizer", str(tmp_path / "no-model")]) == 2
    error = capsys.readouterr().err
    assert f"--tokenizer {tmp_path / 'no-model'}: no tokenizer loads from there" in error


def test_a_broken_line_is_skipped_with_a_warning(watched: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with (watched / "mismatch.jsonl").open("a") as log:
        log.write('{"step": 4}\n')
    assert verl_events_main(["mismatch", str(watched)]) == 0
    assert (
        "mismatch.jsonl:4: not a mismatch record (it lacks run, stage, rank, time); skipped" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"top_k": -1}, "option top_k: -1 is not allowed"),
        ({"top_k": 5000}, "option top_k: 5000 is not allowed"),
        ({"prefill_steps": ["x"]}, "option prefill_steps"),
        ({"prefill_engine": ""}, "option prefill_engine: '' is not allowed"),
        ({"prefill_engine": "my engine.py"}, "use an import path like"),
        ({"prefill_replays": "yes"}, "option prefill_replays: 'yes' is not allowed; use true or false"),
        ({"prefill_steps": [2]}, "option prefill_steps: the engine prefill needs option prefill_engine"),
        ({"prefill_replays": True}, "option prefill_replays: the engine prefill needs option prefill_engine"),
    ],
)
def test_bad_options_are_refused_at_install(tmp_path: Path, options: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "mismatch", **options}]})


def test_an_engine_that_fails_is_logged_and_training_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = {"name": "mismatch", "prefill_steps": [1], "prefill_engine": "no_such_module:prefill"}
    old, rollout = random_gap()
    inputs = {"rollout_log_probs": rollout, "prompts": torch.ones(3, 2, dtype=torch.long)}
    inputs |= {"responses": torch.ones(3, 4, dtype=torch.long), "attention_mask": torch.ones(3, 6, dtype=torch.long)}
    with caplog.at_level(logging.ERROR), verl_events.install({"save_path": str(tmp_path), "observers": [config]}):
        log_prob_stage(1, old, inputs)
        log_prob_stage(2, old, inputs)
    assert [r.step for r in records(tmp_path)] == [1, 2]  # the line comes before the engine is asked
    assert "no_such_module" in caplog.text


def test_the_engine_gets_each_rows_tokens_at_the_prefill_steps_only(tmp_path: Path) -> None:
    asked.clear()
    config = {"name": "mismatch", "prefill_steps": ["2-3"], "prefill_engine": f"{__name__}:remember_prefill"}
    old, rollout = random_gap()
    batch = padded_batch().batch
    inputs = {"rollout_log_probs": rollout, **{key: batch[key] for key in ("prompts", "responses", "attention_mask")}}
    with verl_events.install({"save_path": str(tmp_path), "observers": [config]}):
        for step in (1, 2, 3, 4):
            log_prob_stage(step, old, inputs)
    assert [(step, rank) for _, step, rank in asked] == [(2, 0), (3, 0)]
    assert asked[0][0] == sampled_sequences(inputs)
    assert isinstance(
        MismatchObserver(prefill_steps=[2], prefill_engine=f"{__name__}:remember_prefill").describe(), str
    )


asked: list[tuple[list[list[int]], int, int]] = []


def remember_prefill(sequences: list[list[int]], step: int, rank: int) -> None:
    asked.append((sequences, step, rank))


# -- the layer profile, on real msprobe tensor dumps ------------------------------


@pytest.fixture
def trainer_model() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def test_the_same_model_on_both_sides_is_within_tolerance_at_every_layer(tmp_path: Path, trainer_model: Tiny) -> None:
    dump_both_sides(tmp_path, copy.deepcopy(trainer_model), trainer_model)
    profile = layer_profile(tmp_path, 1)
    assert [m.module for m in profile.layers] == ["model.embed", "model.layers.0", "model.layers.1", "model.norm"]
    assert all(m.error == 0.0 and m.calls == 2 for m in profile.modules)
    assert profile.first_past is None and profile.grows_most is None


def test_an_engine_in_bfloat16_is_past_tolerance_from_the_embedding_on(
    tmp_path: Path, trainer_model: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    dump_both_sides(tmp_path, copy.deepcopy(trainer_model).to(torch.bfloat16), trainer_model)
    profile = layer_profile(tmp_path, 1)
    assert profile.first_past is not None and profile.first_past.module == "model.embed"
    assert all(m.error > profile.tolerance for m in profile.layers)

    for _ in range(2):
        assert verl_events_main(["mismatch", str(tmp_path), "--layers", "1"]) == 0
        text = capsys.readouterr().out
        assert "the error enters at model.embed" in text
    assert verl_events_main(["mismatch", str(tmp_path), "--layers", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["first_past_tolerance"] == "model.embed"
    picture = tmp_path / "layers.svg"
    assert verl_events_main(["mismatch", str(tmp_path), "--layers", "1", "--plot", str(picture)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"plot: {picture}"
    assert picture.read_text().lstrip().startswith("<?xml") and "<svg" in picture.read_text()


def test_a_nan_on_one_side_is_past_tolerance_where_it_enters(
    tmp_path: Path, trainer_model: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = copy.deepcopy(trainer_model)
    with torch.no_grad():
        trainer_model.model.layers[1][0].weight[0, 0] = math.nan
    dump_both_sides(tmp_path, engine, trainer_model)
    profile = layer_profile(tmp_path, 1)
    assert profile.first_past is not None and profile.first_past.module == "model.layers.1"
    assert verl_events_main(["mismatch", str(tmp_path), "--layers", "1"]) == 0
    assert "the error enters at model.layers.1: not finite (nan)" in capsys.readouterr().out
    # --json has no NaN: JSON has none, and jq refuses Python's.
    assert verl_events_main(["mismatch", str(tmp_path), "--layers", "1", "--json"]) == 0
    text = capsys.readouterr().out
    assert "NaN" not in text and json.loads(text)["first_past_tolerance"] == "model.layers.1"


def test_sides_that_ran_different_forwards_are_refused_with_the_setting(tmp_path: Path, trainer_model: Tiny) -> None:
    dump_both_sides(tmp_path, copy.deepcopy(trainer_model), trainer_model, engine_calls=1)
    with pytest.raises(MismatchInputError, match="log_prob_micro_batch_size_per_gpu=1"):
        layer_profile(tmp_path, 1)


def test_statistics_dumps_are_refused_with_the_config_to_use(tmp_path: Path, trainer_model: Tiny) -> None:
    dump_both_sides(tmp_path, copy.deepcopy(trainer_model), trainer_model, config="statistics_L0")
    with pytest.raises(MismatchInputError, match="holds statistics, not tensors.*tensor_L0"):
        layer_profile(tmp_path, 1)


def test_a_step_without_dumps_says_what_to_select(
    tmp_path: Path, trainer_model: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    dump_both_sides(tmp_path, copy.deepcopy(trainer_model), trainer_model)
    assert verl_events_main(["mismatch", str(tmp_path), "--layers", "2"]) == 2
    error = capsys.readouterr().err
    assert "no actor_compute_log_prob dump for step 2, rank 0" in error and "config_path: tensor_L0" in error
    for session in (tmp_path / "step_1/rollout_prefill").rglob("dump.json"):
        session.unlink()
    assert verl_events_main(["mismatch", str(tmp_path), "--layers", "1"]) == 2
    assert "prefill_steps: [1]" in capsys.readouterr().err


# -- armed by the sentinel: the replayed step through the engine, without a re-run ------


class LogProbWorker:
    """A trainer worker: one forward per sequence, and log-probs ``gap`` away from the rollout's."""

    def __init__(self, model: Tiny) -> None:
        self.actor_module = model
        self.gap = 0.0

    @verl_events.emits_stage("actor_compute_log_prob")
    def compute_log_prob(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            for sequence in sampled_sequences(batch):
                self.actor_module(torch.tensor([sequence]))
        return {"old_log_probs": batch["rollout_log_probs"] + self.gap}


ENGINE: list[Tiny] = []


def engine_prefill(sequences: list[list[int]], step: int, rank: int) -> None:
    """A rollout engine for the test: ENGINE's model, as the CPU rollout server runs it."""
    with torch.no_grad(), stage("rollout_prefill", role="rollout", step=step, model=ENGINE[0], rank=rank):
        for sequence in sequences:
            ENGINE[0](torch.tensor([sequence]))


def test_a_gap_anomaly_replays_the_step_and_the_engine_prefills_it_for_the_layer_profile(
    tmp_path: Path, trainer_model: Tiny
) -> None:
    """docs/mismatch.md's armed config: the sentinel's gap rule fires at step 2, the stage is
    replayed for the armed msprobe, and the mismatch observer hands the replayed step to the
    engine, whose own msprobe entry dumps it: the layer profile of the bad step, no re-run."""
    block = next(b for b in doc_blocks("yaml", DOC) if "prefill_replays: true" in b)
    config = yaml.safe_load(block)
    mismatch = next(entry for entry in config["observers"] if entry["name"] == "mismatch")
    mismatch["prefill_engine"] = f"{__name__}:engine_prefill"
    ENGINE[:] = [copy.deepcopy(trainer_model).to(torch.bfloat16)]
    worker = LogProbWorker(trainer_model)
    batch = padded_batch().batch
    inputs = {key: batch[key] for key in ("prompts", "responses", "attention_mask", "response_mask")}
    inputs["rollout_log_probs"] = torch.full(batch["responses"].shape, -2.0)
    with verl_events.install({**config, "save_path": str(tmp_path)}):
        for step, gap in ((1, 0.001), (2, 2.0), (3, 0.001)):
            verl_events.set_step(step)
            worker.gap = gap
            worker.compute_log_prob(inputs)

    dumps = sorted(str(p.relative_to(tmp_path).parent.parent.parent) for p in tmp_path.rglob("dump.json"))
    # The replay of step 2, the engine's prefill of it, and step 3, captured after the anomaly.
    assert dumps == ["step_2/actor_compute_log_prob.replay", "step_2/rollout_prefill", "step_3/actor_compute_log_prob"]
    assert [r.step for r in records(tmp_path)] == [1, 2, 3]  # the replay writes no line
    profile = layer_profile(tmp_path, 2)
    assert "actor_compute_log_prob.replay" in str(profile.trainer)
    assert profile.first_past is not None and profile.first_past.module == "model.embed"


def test_a_record_of_another_run_is_skipped_with_a_warning(
    watched: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "copy"
    shutil.copytree(watched, run)
    log = run / "mismatch.jsonl"
    first = json.loads(log.read_text().splitlines()[0])
    log.write_text(json.dumps({**first, "run": "another-run"}) + "\n" + log.read_text())
    assert verl_events_main(["mismatch", str(run), "--json"]) == 0
    out, err = capsys.readouterr()
    assert f"{log}:1 was skipped: it belongs to run 'another-run'" in err
    steps = [(row["step"], row["rank"]) for row in json.loads(out)["steps"]]
    assert len(steps) == len(set(steps))  # the other run's line is not counted twice


def test_the_scale_line_reads_a_mean_as_a_probability_difference_and_names_steps_past_ppos_clip() -> None:
    from verl_events.apps.mismatch.scale import scale_line

    calm = [{"step": 1, "tokens": 100, "mean": 0.01, "p99": 0.05, "max": 0.1}]
    line = scale_line(calm)
    assert line is not None and "a mean |Δ log p| of 0.01 is a 1.01% difference" in line
    assert line.endswith("the largest gap, 0.1, is within it")
    rough = [*calm, {"step": 2, "tokens": 100, "mean": 0.03, "p99": 0.25, "max": 0.9}]
    assert str(scale_line(rough)).endswith("at least 1 % of the tokens are past it at step(s) 2")
    assert scale_line([{"step": 1, "tokens": 0, "mean": 0.0, "p99": 0.0, "max": 0.0}]) is None
