from __future__ import annotations

import pytest
import torch

from .support import Small


@pytest.fixture
def model() -> Small:
    torch.manual_seed(0)
    return Small()
