from __future__ import annotations

from pathlib import Path

import pytest

from .processes import driver


@pytest.fixture(scope="session")
def whole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The driver's two steps, undisturbed: the whole stages to compare with."""
    save_path = tmp_path_factory.mktemp("whole") / "run"
    child = driver(save_path)
    assert child.finish() == 0, child.stderr
    assert child.stdout_lines[-1] == "TRAINING FINISHED\n"
    return save_path
