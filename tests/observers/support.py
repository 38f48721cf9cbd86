"""Helpers the observer tests share: a small model and msprobe's config and dump files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


class Small(torch.nn.Module):
    """Two linears and a relu: 8 L1 entries for a forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 4)
        self.fc2 = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def run_model(model: torch.nn.Module, backward: bool = True) -> None:
    x = torch.randn(2, 4, requires_grad=True)
    out = model(x).sum()
    if backward:
        out.backward()


def write_msprobe_config(path: Path, **fields: Any) -> Path:
    config: dict[str, Any] = {
        "task": "statistics",
        "rank": [],
        "step": [],
        "level": "L1",
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    }
    config.update(fields)
    path.write_text(json.dumps(config))
    return path


def dump_entries(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())["data"]
    return data
