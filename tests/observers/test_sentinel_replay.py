"""The sentinel's side of a replay (observers/sentinel/replay.py) on what verl hands a stage."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

tensordict = pytest.importorskip("tensordict")

from verl_events import StageEnd
from verl_events.observers.sentinel.replay import keep_inputs


def test_the_inputs_of_a_consolidated_tensordict_are_kept_and_read_back(tmp_path: Path) -> None:
    """verl's engine workers get a consolidated TensorDict (one storage, viewed as int64 and
    float32) holding jagged tensors (its no-padding layout); torch.save refuses such views
    as they are, so keep_inputs must copy them out."""
    ids = torch.nested.as_nested_tensor([torch.arange(3), torch.arange(5)], layout=torch.jagged)
    mask = torch.nested.as_nested_tensor([torch.ones(3), torch.ones(5)], layout=torch.jagged)
    batch = tensordict.TensorDict({"input_ids": ids, "loss_mask": mask, "t": torch.zeros(2, 4)}, batch_size=[2])
    event = StageEnd(
        stage="actor_compute_log_prob",
        role="actor",
        step=2,
        rank=1,
        world_size=2,
        replay=True,
        inputs=batch.consolidate(),
    )

    kept = keep_inputs(tmp_path, event)

    assert kept == "step_2/actor_compute_log_prob.replay/inputs_rank1.pt"
    loaded = torch.load(tmp_path / kept, weights_only=True)
    assert sorted(loaded) == ["input_ids", "loss_mask", "t"]
    assert [row.tolist() for row in loaded["input_ids"].unbind()] == [[0, 1, 2], [0, 1, 2, 3, 4]]
    assert torch.equal(loaded["t"], torch.zeros(2, 4))
