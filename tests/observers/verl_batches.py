"""verl batches as verl's trainer and its engine workers hand them around, built with verl's own code."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding


def padded_batch(**extra: torch.Tensor) -> DataProto:
    """A left-padded prompt, right-padded response batch as verl's rollout leaves it:
    3 sequences, prompts of 2, 3 and 4 tokens, responses of 2, 4 and 1."""
    prompts = torch.tensor([[0, 0, 11, 12], [0, 13, 14, 15], [16, 17, 18, 19]])
    responses = torch.tensor([[21, 22, 0, 0], [23, 24, 25, 26], [27, 0, 0, 0]])
    attention = torch.cat([prompts != 0, responses != 0], dim=1).long()
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "response_mask": (responses != 0).long(),
        "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
        **extra,
    }
    return DataProto.from_dict(tensors)


def engine_inputs(batch: DataProto, **flags: Any) -> TensorDict:
    """What the trainer hands verl 0.9's engine workers: ray_trainer's _compute_old_log_prob steps 1-3."""
    data = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(data, compute_loss=False, **flags)
    return data


def nested_like(data: TensorDict, values: torch.Tensor) -> torch.Tensor:
    """A model output in the no-padding layout: one value per token of each sequence."""
    return torch.nested.nested_tensor_from_jagged(values, offsets=data["input_ids"].offsets())
