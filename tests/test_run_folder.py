"""A launcher that fills ``{run}`` once and hands the filled save_path on (as
``verl-events demo --engine verl`` does for verl's workers) still gets ``latest``.

The processes it starts have a run id of their own (Ray's, under verl) and a
save_path without ``{run}``: they claim the folder, but only the launcher knows
the link, so :func:`verl_events.config.start_run_folder` makes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import verl_events
from verl_events.config import load_config, start_run_folder
from verl_events.layout import LATEST_LINK, RUN_FILE, owner_of

LAUNCHER = """
import json, os, subprocess, sys
from verl_events.config import load_config, start_run_folder

config = load_config({"save_path": sys.argv[1], "observers": [{"name": "timing"}]})
folder = start_run_folder(config)
handed_on = folder / "observers.json"
handed_on.write_text(json.dumps({"save_path": str(folder), "observers": [{"name": "timing"}]}))
# The worker's run id is not the launcher's, as Ray's is not the demo's.
env = dict(os.environ, VERL_EVENTS_RUN_ID=f"worker-of-{os.getpid()}")
subprocess.run([sys.executable, "-c", sys.argv[2], str(handed_on)], env=env, check=True)
print(json.dumps({"folder": str(folder), "worker_run": env["VERL_EVENTS_RUN_ID"]}))
"""

WORKER = """
import sys
import verl_events

with verl_events.install(sys.argv[1]):
    with verl_events.stage("actor_update", step=1):
        pass
"""


def launch(save_path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VERL_EVENTS_RUN_ID"}
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, save_path, WORKER], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_runs_launched_with_a_filled_save_path_get_latest_pointing_at_the_newest(tmp_path: Path) -> None:
    first, second = launch(str(tmp_path / "runs/{run}")), launch(str(tmp_path / "runs/{run}"))
    assert first["folder"] != second["folder"]
    for run in (first, second):
        folder = Path(run["folder"])
        assert folder.parent == tmp_path / "runs"
        assert owner_of(folder) == run["worker_run"]  # the worker claimed the folder the launcher named
        assert (folder / "timing/rank0.jsonl").is_file()
    latest = tmp_path / "runs" / LATEST_LINK
    assert latest.is_symlink() and os.readlink(latest) == Path(second["folder"]).name


def test_a_worker_given_the_filled_save_path_alone_claims_it_but_makes_no_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the launcher must make the link: the save_path it hands on has no ``{run}``."""
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "launcher")
    filled = load_config({"save_path": str(tmp_path / "runs/{run}")})
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "worker")
    with verl_events.install({"save_path": str(filled.save_path), "observers": [{"name": "timing"}]}):
        with verl_events.stage("actor_update", step=1):
            pass
    assert (filled.save_path / RUN_FILE).is_file() and owner_of(filled.save_path) == "worker"
    assert not (tmp_path / "runs" / LATEST_LINK).exists()


def test_start_run_folder_without_run_in_the_save_path_makes_the_folder_and_no_link(tmp_path: Path) -> None:
    config = load_config({"save_path": str(tmp_path / "plain")})
    assert config.latest is None
    assert start_run_folder(config) == tmp_path / "plain" and (tmp_path / "plain").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]
