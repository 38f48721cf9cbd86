from __future__ import annotations

from collections.abc import Iterator

import pytest

import verl_events
from verl_events import _resolve


@pytest.fixture(autouse=True)
def _clean_bus() -> Iterator[None]:
    """Every test starts and ends with nothing installed and no announced step."""
    yield
    current = verl_events.current_installation()
    if current is not None:
        current.close()
    verl_events.set_step(None)
    verl_events.reset_model_paths()
    assert not verl_events.stage_begin.receivers, "a test left a receiver connected"
    _resolve._bad_env_warned.clear()
