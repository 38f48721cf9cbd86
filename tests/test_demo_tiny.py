"""The tiny demo's output (issue 17, item 9: noise): no torch warning under msprobe's
module hooks, and a summary table that cuts no stage name."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the demo trains with torch and dumps with msprobe
pytest.importorskip("msprobe")

from verl_events.apps.demo.options import DemoOptions
from verl_events.apps.demo.tiny import DEMO_STAGES, run_rank

from .support import verl_events_exe
from .terminal import run_in_terminal

pytestmark = pytest.mark.slow  # runs the demo: skipped by -m 'not slow'


@pytest.mark.parametrize("config_path", ["statistics_L0", "statistics_mix"])
def test_module_level_dumps_of_the_demo_make_torch_warn_nothing_about_backward_hooks(
    tmp_path: Path, config_path: str
) -> None:
    """msprobe's L0 and mix dumps hook every submodule with a full backward hook; torch
    warns "Full backward hook is firing ..." for one whose inputs need no gradient (token
    ids).  The demo's two backward stages, critic_update and actor_update, run hooked,
    in this process."""
    config = {
        "save_path": str(tmp_path / "run"),
        "observers": [
            {"name": "msprobe", "config_path": config_path, "steps": [1], "stages": ["critic_update", "actor_update"]}
        ],
    }
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run_rank(0, DemoOptions(config, steps=1, nproc=1, seed=0))
    hooked = [f"{w.filename}:{w.lineno}: {w.message}" for w in said if "Full backward hook" in str(w.message)]
    assert not hooked
    dumps = sorted(str(p.relative_to(tmp_path / "run")) for p in (tmp_path / "run").rglob("dump.json"))
    assert dumps == [f"step_1/{stage}/step0/rank0/dump.json" for stage in ("actor_update", "critic_update")]


def test_the_overhead_table_in_a_60_column_terminal_cuts_no_stage_name(tmp_path: Path) -> None:
    """The command, in a terminal window 60 columns wide."""
    args = [verl_events_exe(), "demo", "--steps", "2", "--save-path", str(tmp_path / "run")]
    status, out = run_in_terminal(args, columns=60, timeout=300)
    assert status == 0, out
    table = out[out.index("Stage overhead") :]
    assert "…" not in table, table
    for name in [*DEMO_STAGES, "msprobe"]:
        assert re.search(rf"(?<!\w){name}(?!\w)", table), f"{name} is cut:\n{table}"


def test_two_ranks_whose_port_is_taken_before_they_meet_try_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The port the demo picks is free when picked; another process may listen on it before
    rank 0 does.  Here one really does (a socket of this test): rank 0 fails with
    EADDRINUSE, and the demo meets on another port instead of failing."""
    import socket

    from verl_events.apps.demo import tiny

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = int(taken.getsockname()[1])
    ports = iter([port])
    free = tiny._free_port
    monkeypatch.setattr(tiny, "_free_port", lambda: next(ports, None) or free())
    config = {"save_path": str(tmp_path / "run"), "observers": [{"name": "timing"}]}
    try:
        save_path = tiny.run_demo(DemoOptions(config, steps=1, nproc=2, seed=0))
    finally:
        taken.close()
    assert sorted(p.name for p in (save_path / "timing").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    assert f"demo: port {port} was taken meanwhile; trying another" in capsys.readouterr().err
