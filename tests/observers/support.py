"""Helpers the observer tests share: a small model and msprobe's config and dump files."""

from __future__ import annotations

import inspect
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


class Net(torch.nn.Module):
    """Two linears and a relu between two identities, for triage to name an op in."""

    def __init__(self) -> None:
        super().__init__()
        # msprobe leaves out a model's first and last submodule once verl is imported
        # (its module_processor's "verl scenario"), as it is in a whole test run; these
        # two take those places, so the layers under test are dumped either way.
        self.first = torch.nn.Identity()
        self.fc1 = torch.nn.Linear(4, 4)
        self.fc2 = torch.nn.Linear(4, 1)
        self.last = torch.nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(torch.relu(self.fc1(x)))
        return out


#: The file triage names as Net's ops' user frame.
NET_FILE = __file__


def forward_line() -> int:
    """The line of Net.forward that calls fc1: the user frame of fc1's ops."""
    lines, first = inspect.getsourcelines(Net.forward)
    return first + next(i for i, line in enumerate(lines) if "self.fc1(" in line)


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
