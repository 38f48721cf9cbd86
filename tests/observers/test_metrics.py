"""extract_metrics: the scalars the sentinel reads from real verl DataProto and TensorDict results."""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.utils.metric.utils import Metric
from verl.workers.utils.padding import no_padding_2_padding

from verl_events.observers.batch import GAP_MAX, GAP_MEAN, as_batch, extract_metrics

from .verl_batches import engine_inputs, nested_like, padded_batch

NAN, INF = float("nan"), float("inf")


# -- metrics ---------------------------------------------------------------------


def test_dataproto_metrics_are_read_from_meta_info_whatever_their_number_type() -> None:
    metrics = {
        "actor/grad_norm": 2.0,
        "actor/pg_loss": torch.tensor(0.5),
        "actor/entropy": np.float32(0.25),
        "critic/vf_loss": [1.0, 2.0, 6.0],  # per micro-batch: the mean
        "actor/pg_clipfrac_max": [0.5, 0.75],  # "max" in the name: the max, as verl's reduce_metrics
        "actor/kl_min": [[0.5], [0.25]],  # nested lists flatten
        "actor/lr": np.array([1.0, 3.0]),
        "note": "text",
        "flag": True,
    }
    result = DataProto.from_dict({"x": torch.zeros(2, 1)}, meta_info={"metrics": metrics})

    assert extract_metrics("actor_update", result, None) == {
        "actor/grad_norm": 2.0,
        "actor/pg_loss": 0.5,
        "actor/entropy": 0.25,
        "critic/vf_loss": 3.0,
        "actor/pg_clipfrac_max": 0.75,
        "actor/kl_min": 0.25,
        "actor/lr": 2.0,
    }


def test_a_nan_anywhere_in_a_list_makes_the_metric_nan() -> None:
    result = DataProto.from_dict({"x": torch.zeros(1, 1)}, meta_info={"metrics": {"actor/grad_norm": [1.0, NAN, 2.0]}})

    assert math.isnan(extract_metrics("actor_update", result)["actor/grad_norm"])


def test_engine_worker_update_metrics_get_the_role_prefix_the_trainer_gives_them() -> None:
    """verl 0.9's update_actor returns train_mini_batch's TensorDict; _update_actor renames its keys."""
    metrics = {
        "grad_norm": [2.0, 4.0],
        "loss": [0.5, 0.5],
        "mfu": [0.25, 0.75],
        "actor/pg_loss": [1.0, 2.0],
        "lr": 0.125,
    }
    result = tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})

    assert extract_metrics("actor_update", result) == {
        "actor/grad_norm": 3.0,
        "actor/loss": 0.5,
        "perf/mfu/actor": 0.5,
        "actor/pg_loss": 1.5,
        "actor/lr": 0.125,
    }


def test_train_batch_takes_its_role_from_the_keys_and_combines_ranks_metric_objects_as_verl_does() -> None:
    ranks = [Metric("mean"), Metric("mean")]
    ranks[0].extend([1.0, 3.0])  # one value per micro-batch
    ranks[1].extend([3.0, 5.0])
    metrics = {"critic/vf_loss": ranks, "grad_norm": 8.0}
    result = tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})

    found = extract_metrics("train_batch", result)

    assert found == {"critic/vf_loss": pytest.approx(Metric.aggregate_dp(ranks)), "critic/grad_norm": 8.0}
    assert found["critic/vf_loss"] == 3.0


def test_a_bare_number_is_the_stage_result_and_a_plain_mapping_is_read_key_by_key() -> None:
    assert extract_metrics("critic_update", 0.5) == {"critic_update/result": 0.5}
    assert extract_metrics("critic_update", torch.tensor([2.0])) == {"critic_update/result": 2.0}
    found = extract_metrics(
        "my_stage", {"loss": torch.tensor(0.25, requires_grad=True) * 2, "scores": torch.tensor([1.0, -4.0, NAN])}
    )
    assert found == {"loss": 0.5, "scores/nonfinite_count": 1.0, "scores/abs_max": 4.0, "scores/mean": -1.5}


# -- tensors ---------------------------------------------------------------------


def test_padded_log_probs_are_reduced_over_response_tokens_and_nonfinite_counts_cover_padding() -> None:
    old = torch.tensor([[-1.0, -3.0, NAN, 0.0], [-0.5, -0.5, -0.5, -0.5], [-8.0, 0.0, 0.0, INF]])
    entropys = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.5, 1.5, 1.5, 1.5], [2.5, 0.0, 0.0, 0.0]])
    result = DataProto.from_dict(
        {"old_log_probs": old, "entropys": entropys, "response_mask": padded_batch().batch["response_mask"]}
    )

    found = extract_metrics("actor_compute_log_prob", result)

    # NaN and inf sit in padding: counted, but outside the response tokens' max and mean.
    assert found["old_log_probs/nonfinite_count"] == 2.0
    assert found["old_log_probs/abs_max"] == 8.0
    assert found["old_log_probs/mean"] == -2.0  # (-1 - 3 - 0.5 * 4 - 8) / 7 response tokens
    assert (found["entropys/abs_max"], found["entropys/mean"], found["entropys/nonfinite_count"]) == (2.5, 1.5, 0.0)
    assert not any(k.startswith("gap/") for k in found)  # no rollout_log_probs


def test_each_stage_reads_only_the_tensors_it_makes() -> None:
    carried = {
        "old_log_probs": torch.ones(3, 4),
        "ref_log_prob": torch.full((3, 4), -2.0),
        "values": torch.full((3, 4), 4.0),
    }
    result = DataProto.from_dict(carried)

    assert set(extract_metrics("compute_values", result)) == {"values/nonfinite_count", "values/abs_max", "values/mean"}
    assert extract_metrics("ref_compute_log_prob", result)["ref_log_prob/mean"] == -2.0
    assert extract_metrics("actor_update", result) == {}


def test_the_gap_is_read_from_verl_engine_workers_nested_log_probs_as_no_padding_2_padding_aligns_them() -> None:
    rollout = torch.tensor([[-1.0, -1.0, 0.0, 0.0], [-2.0, -2.0, -2.0, -2.0], [-4.0, 0.0, 0.0, 0.0]])
    data = engine_inputs(padded_batch(rollout_log_probs=rollout), calculate_entropy=True)
    total = data["input_ids"].values().shape[0]
    log_probs = nested_like(data, -torch.arange(total, dtype=torch.float32) / 4)
    result = tu.get_tensordict(
        tensor_dict={"log_probs": log_probs, "entropy": nested_like(data, torch.full((total,), 0.5))},
        non_tensor_dict={"metrics": {"mfu": 0.5}},
    )

    found = extract_metrics("actor_compute_log_prob", result, data)

    aligned = no_padding_2_padding(log_probs, data)  # verl's own alignment
    response = data["response_mask"].bool()
    gap = (aligned - rollout).abs()[response]
    assert found[GAP_MAX] == gap.max().item() > 0
    assert found[GAP_MEAN] == pytest.approx(gap.mean().item(), rel=1e-6)
    assert found["old_log_probs/mean"] == pytest.approx(aligned[response].mean().item(), rel=1e-6)
    assert found["old_log_probs/abs_max"] == aligned[response].abs().max().item()
    assert found["entropys/mean"] == 0.5 and found["rollout_log_probs/abs_max"] == 4.0
    assert found["mfu"] == 0.5


def test_log_probs_written_in_place_after_one_reader_are_read_again_by_the_next() -> None:
    """The sentinel and the mismatch observer share the response tokens picked out of one
    stage end's nested log-probs; a write in between must not leave the second with stale ones."""
    rollout = torch.tensor([[-1.0, -1.0, 0.0, 0.0], [-2.0, -2.0, -2.0, -2.0], [-4.0, 0.0, 0.0, 0.0]])
    data = engine_inputs(padded_batch(rollout_log_probs=rollout), calculate_entropy=True)
    total = data["input_ids"].values().shape[0]
    log_probs = nested_like(data, -torch.arange(total, dtype=torch.float32) / 4)
    result = tu.get_tensordict(tensor_dict={"log_probs": log_probs}, non_tensor_dict={})
    first = extract_metrics("actor_compute_log_prob", result, data)
    assert extract_metrics("actor_compute_log_prob", result, data) == first

    log_probs.values().mul_(2)
    again = extract_metrics("actor_compute_log_prob", result, data)

    aligned = no_padding_2_padding(log_probs, data)
    response = data["response_mask"].bool()
    assert again["old_log_probs/mean"] == pytest.approx(2 * first["old_log_probs/mean"], rel=1e-6)
    assert again[GAP_MAX] == (aligned - rollout).abs()[response].max().item()


def test_the_gap_is_read_from_verls_v1_trainer_jagged_responses() -> None:
    """verl's default (v1) trainer hands the stage TransferQueue's layout: the response
    tensors jagged, a row per response.  The gap is the one the padded layout gives."""
    rows = [torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -2.0, -2.0, -2.0]), torch.tensor([-4.0])]
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    data = engine_inputs(padded_batch(rollout_log_probs=padded), calculate_entropy=True)
    total = data["input_ids"].values().shape[0]
    log_probs = nested_like(data, -torch.arange(total, dtype=torch.float32) / 4)
    result = tu.get_tensordict(tensor_dict={"log_probs": log_probs}, non_tensor_dict={"metrics": {}})
    by_padding = extract_metrics("actor_compute_log_prob", result, data)
    jagged = data.clone()
    jagged["rollout_log_probs"] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    jagged["response_mask"] = torch.nested.as_nested_tensor(
        [torch.ones(len(r), dtype=torch.long) for r in rows], layout=torch.jagged
    )

    found = extract_metrics("actor_compute_log_prob", result, jagged)

    assert found[GAP_MAX] == by_padding[GAP_MAX] > 0
    assert found[GAP_MEAN] == pytest.approx(by_padding[GAP_MEAN], rel=1e-6)
    assert (
        found["rollout_log_probs/abs_max"] == 4.0
        and found["rollout_log_probs/mean"] == by_padding["rollout_log_probs/mean"] == -2.0
    )


def test_the_gap_of_padded_log_probs_uses_attention_masks_response_part_without_a_response_mask() -> None:
    batch = padded_batch()
    inputs = DataProto.from_dict(
        {"attention_mask": batch.batch["attention_mask"], "rollout_log_probs": torch.full((3, 4), -1.0)}
    )
    old = torch.full((3, 4), -1.0)
    old[1, 3] = -3.0  # a response token: counts
    old[0, 3] = -65.0  # padding: left out
    found = extract_metrics("actor_compute_log_prob", DataProto.from_dict({"old_log_probs": old}), inputs)

    assert found[GAP_MAX] == 2.0
    assert found[GAP_MEAN] == pytest.approx(2.0 / 7, rel=1e-6)


def test_no_gap_is_reported_when_no_response_token_is_left() -> None:
    inputs = DataProto.from_dict({"rollout_log_probs": torch.zeros(2, 3), "response_mask": torch.zeros(2, 3)})
    found = extract_metrics("actor_compute_log_prob", DataProto.from_dict({"old_log_probs": torch.ones(2, 3)}), inputs)

    assert GAP_MAX not in found and GAP_MEAN not in found
    assert found["old_log_probs/mean"] == 0.0  # no valid token: 0


def test_tokens_where_either_side_is_not_finite_are_left_out_of_the_gap() -> None:
    inputs = DataProto.from_dict({"rollout_log_probs": torch.tensor([[-1.0, NAN]]), "response_mask": torch.ones(1, 2)})
    old = torch.tensor([[-1.5, -1.0]])
    found = extract_metrics("actor_compute_log_prob", DataProto.from_dict({"old_log_probs": old}), inputs)

    assert (found[GAP_MAX], found[GAP_MEAN], found["rollout_log_probs/nonfinite_count"]) == (0.5, 0.5, 1.0)


def test_reference_log_probs_computed_by_the_actor_are_named_as_reference_with_no_gap() -> None:
    """verl 0.9 with the reference inside the actor (LoRA) calls compute_log_prob with calculate_entropy=False."""
    data = engine_inputs(
        padded_batch(rollout_log_probs=torch.zeros(3, 4)), calculate_entropy=False, no_lora_adapter=True
    )
    total = data["input_ids"].values().shape[0]
    result = tu.get_tensordict(tensor_dict={"log_probs": nested_like(data, torch.full((total,), -2.0))})

    found = extract_metrics("actor_compute_log_prob", result, data)

    assert found["ref_log_prob/mean"] == -2.0
    assert not any(k.startswith(("gap/", "old_log_probs/")) for k in found)


def test_a_nested_tensor_without_response_lengths_counts_every_element() -> None:
    values = torch.tensor([1.0, -2.0, 4.0, NAN])
    result = TensorDict(
        {"log_probs": torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor([0, 1, 4]))}, batch_size=[2]
    )

    found = extract_metrics("ref_compute_log_prob", result, None)

    assert found == {"ref_log_prob/nonfinite_count": 1.0, "ref_log_prob/abs_max": 4.0, "ref_log_prob/mean": 1.0}


def test_a_batch_read_in_a_process_that_never_imported_torch_holds_no_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mismatch observer asks for tensors whatever the stage returned: without torch
    imported nothing can be a tensor, which is not an error."""
    batch = as_batch({"rollout_log_probs": [-1.0, -2.0]})
    assert batch is not None
    monkeypatch.delitem(sys.modules, "torch")  # as in a process that never imported it

    assert batch.tensor("rollout_log_probs") is None
    assert batch.tensor("absent") is None


# -- odd inputs never raise ------------------------------------------------------------


class Unreadable:
    """A record whose tensors cannot be read."""

    meta_info = {"metrics": {"actor/grad_norm": 1.0}}

    class _Tensors(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            raise RuntimeError("gone")

    tensors = _Tensors(values=1)


def test_what_cannot_be_read_is_left_out_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="verl_events.batch")

    reported: set[tuple[str, str]] = set()  # the caller's (the sentinel's) record of what it logged
    for _ in range(2):
        assert extract_metrics("compute_values", Unreadable(), reported=reported) == {"actor/grad_norm": 1.0}

    [record] = [r for r in caplog.records if "could not read" in r.getMessage()]
    assert "tensors at stage compute_values (RuntimeError: gone)" in record.getMessage()


@pytest.mark.parametrize(
    "result",
    [None, object(), "text", ["a", "b"], {"metrics": {"nested": 1}}, torch.tensor([1, 2]), np.array(["x"]), True],
    ids=["none", "object", "str", "strings", "nested-dict", "int-tensor", "str-array", "bool"],
)
def test_odd_results_give_no_metrics(result: Any) -> None:
    assert extract_metrics("actor_update", result, object()) == {}
