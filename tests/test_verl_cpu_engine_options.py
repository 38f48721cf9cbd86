"""The CPU job's engine options: the observers name no engine, the job's config names its server."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from verl_events import ConfigError
from verl_events.apps.demo.verl_engine import prepare_config
from verl_events.apps.verl_cpu.engine_options import ROLLOUT_ENGINES, with_rollout_engines
from verl_events.config import build_observers, import_target, load_config

SERVER = "verl_events.apps.verl_cpu.hf_rollout"


def test_each_entry_that_asks_an_engine_gets_the_jobs_server_and_keeps_its_own_options() -> None:
    config = {
        "preset": "always_on",
        "observers": [
            {"name": "mismatch", "prefill_steps": [2]},
            {"name": "weight_sync", "receipt_engine": None, "canary": True},
            {"name": "timing"},
        ],
    }
    filled = with_rollout_engines(config)
    mismatch, weight_sync, timing = filled["observers"]
    assert mismatch == {"name": "mismatch", "prefill_steps": [2], "prefill_engine": f"{SERVER}:request_prefill"}
    # The entry's own null wins: a config that asks for no receipt gets none.
    assert weight_sync == {
        "name": "weight_sync",
        "receipt_engine": None,
        "canary": True,
        "canary_engine": f"{SERVER}:request_canary",
    }
    assert timing == {"name": "timing"} and filled["preset"] == "always_on"
    assert config["observers"][0] == {"name": "mismatch", "prefill_steps": [2]}  # the caller's config is kept
    assert with_rollout_engines({"preset": "always_on"}) == {"preset": "always_on"}


def test_without_the_jobs_options_the_observers_refuse_what_needs_an_engine(tmp_path: Path) -> None:
    asks = [{"name": "mismatch", "prefill_steps": [2]}, {"name": "weight_sync", "canary": True}]
    for entry in asks:
        with pytest.raises(ConfigError, match="needs option (prefill|canary)_engine"):
            build_observers(load_config({"save_path": str(tmp_path), "observers": [entry]}), set_up=False)
    config = load_config(with_rollout_engines({"save_path": str(tmp_path), "observers": asks}))
    mismatch, weight_sync = build_observers(config, set_up=False)
    assert mismatch.prefill_engine == ROLLOUT_ENGINES["mismatch"]["prefill_engine"]  # type: ignore[attr-defined]
    assert weight_sync.receipt_engine == f"{SERVER}:request_receipt"  # type: ignore[attr-defined]
    assert weight_sync.canary_engine == f"{SERVER}:request_canary"  # type: ignore[attr-defined]


def test_the_demos_config_points_the_observers_at_the_jobs_server(tmp_path: Path) -> None:
    file = tmp_path / "observers.yaml"
    file.write_text(yaml.safe_dump({"observers": [{"name": "mismatch", "prefill_replays": True}]}))
    config, _ = prepare_config(str(file), str(tmp_path / "run"))
    assert config["observers"] == [
        {"name": "mismatch", "prefill_replays": True, "prefill_engine": f"{SERVER}:request_prefill"}
    ]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's, when verl's replica module imports
def test_each_option_names_a_function_of_the_jobs_rollout_server_with_the_observers_signature() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("verl")
    parameters = {"prefill_engine": 3, "receipt_engine": 1, "canary_engine": 2}
    for options in ROLLOUT_ENGINES.values():
        for option, path in options.items():
            function = import_target(path, f"option {option}")
            assert len(inspect.signature(function).parameters) == parameters[option], path
