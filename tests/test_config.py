from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_events import ConfigError
from verl_events.config import load_config

YAML = """
save_path: out/profile
strict: false
observers:
  - name: recording
    steps: [1, "4-5"]
    stages: [actor_update]
    priority: 3
  - _target_: verl_events.testing:RecordingObserver
    timings: true
"""


def test_yaml_file_dict_and_omegaconf_give_the_same_config(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(YAML)
    from_file = load_config(path)
    from_dict = load_config(OmegaConf.to_container(OmegaConf.create(YAML)))
    from_omegaconf = load_config(OmegaConf.create(YAML))
    assert from_file == from_dict == from_omegaconf
    first, second = from_file.observers
    assert from_file.save_path == Path("out/profile")
    assert first.name == "recording" and first.priority == 3
    assert first.selection.steps == {1, 4, 5} and first.selection.stages == {"actor_update"}
    assert second.target == "verl_events.testing:RecordingObserver" and dict(second.options) == {"timings": True}


def test_empty_sources_give_the_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(None) == load_config(empty) == load_config({})
    assert load_config(None).save_path == Path("outputs/profile")


def test_dotlist_overrides_reach_into_the_observer_list() -> None:
    cfg = load_config(YAML_DICT(), ["observers.0.steps=[2,3]", "strict=true", "observers.1.enabled=false"])
    assert cfg.strict is True
    assert cfg.observers[0].selection.steps == {2, 3}
    assert cfg.observers[1].enabled is False


def YAML_DICT() -> dict:  # type: ignore[type-arg]
    return {"observers": [{"name": "recording"}, {"name": "recording"}]}


@pytest.mark.parametrize("override", ["no_equals_sign", "=3"])
def test_malformed_overrides_are_errors(override: str) -> None:
    with pytest.raises(ConfigError, match="is not key=value"):
        load_config({}, [override])


def test_yaml_that_does_not_parse_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("observers:\n  - name: recording\n    steps: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml' is not valid YAML at line \d+, column \d+"):
        load_config(path)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path / "nope.yaml")


def test_yaml_that_is_not_a_mapping_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(
        ConfigError,
        match="must hold a mapping with keys preset, save_path, strict, max_failures, replay, observers; found a list",
    ):
        load_config(path)


def test_unknown_top_level_keys_are_errors() -> None:
    with pytest.raises(
        ConfigError,
        match=r"config: unknown key 'observer'; allowed: preset, save_path, strict, max_failures, replay, observers",
    ):
        load_config({"observer": []})


@pytest.mark.parametrize(
    ("raw", "pattern"),
    [
        ({"strict": "yes"}, r"strict: 'yes' is not allowed; use true or false"),
        ({"save_path": 3}, r"save_path: 3 is not allowed"),
        ({"max_failures": 0}, r"max_failures: 0 is not allowed; use an integer >= 1, or null for never"),
        ({"observers": {"name": "x"}}, r"observers: .* use a list"),
        ({"observers": ["recording"]}, r"observers\[0\]: 'recording' is not allowed; each observer is a mapping"),
        ({"observers": [{"steps": [1]}]}, r"observers\[0\]: give exactly one of 'name'"),
        ({"observers": [{"name": "a", "_target_": "b.C"}]}, r"give exactly one of"),
        ({"observers": [{"name": ""}]}, r"observers\[0\]\.name: '' is not allowed"),
        (
            {"observers": [{"name": "recording", "priority": "high"}]},
            r"observers\[0\]\.priority: 'high' is not allowed; use an integer",
        ),
        ({"observers": [{"name": "recording", "priority": True}]}, r"priority: True is not allowed"),
        ({"observers": [{"name": "recording", "enabled": 1}]}, r"enabled: 1 is not allowed"),
        ({"observers": [{"name": "recording", "steps": ["5-2"]}]}, r"observers\[0\]\.steps: '5-2' is not allowed"),
        ({"observers": [{"name": "recording", "ranks": [-1]}]}, r"observers\[0\]\.ranks: -1 is not allowed"),
        ({"observers": [{"name": "recording", "stages": ["x/.."]}]}, r"not a valid stage name"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(raw: dict, pattern: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=pattern):
        load_config(raw)


def test_a_non_config_source_is_an_error() -> None:
    with pytest.raises(ConfigError, match="int is not a config"):
        load_config(3)


def test_run_in_save_path_is_this_runs_id_and_latest_sits_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "nightly-7")
    cfg = load_config({"save_path": "outputs/sentinel/{run}"})
    assert (cfg.save_path, cfg.latest) == (Path("outputs/sentinel/nightly-7"), Path("outputs/sentinel/latest"))
    inner = load_config({"save_path": "outputs/{run}/profile"})
    assert (inner.save_path, inner.latest) == (Path("outputs/nightly-7/profile"), None)
    assert load_config({"save_path": "outputs/fixed"}).latest is None


def test_a_placeholder_other_than_run_is_refused_naming_it() -> None:
    with pytest.raises(
        ConfigError, match=r"save_path: 'outputs/\{time\}' holds '\{time\}', which is not a placeholder; use \{run\}"
    ):
        load_config({"save_path": "outputs/{time}"})


def test_a_config_files_input_paths_are_taken_from_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "observers.yaml").write_text(
        "save_path: out/{run}\n"
        "observers:\n"
        "  - name: recording\n"
        "    config_path: msprobe/statistics_L1.json\n"
        "    other_path: /abs/file.json\n"
        "    label: plain/words\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "r1")
    cfg = load_config("../configs/observers.yaml")  # a relative path to the file, from another folder
    options = cfg.observers[0].options
    assert Path(options["config_path"]).resolve() == (folder / "msprobe/statistics_L1.json").resolve()
    assert options["other_path"] == "/abs/file.json" and options["label"] == "plain/words"
    assert cfg.save_path == Path("out/r1")  # where the run writes: the working directory's


def test_a_dict_config_keeps_the_working_directory() -> None:
    cfg = load_config({"observers": [{"name": "recording", "config_path": "msprobe/x.json"}]})
    assert cfg.observers[0].options["config_path"] == "msprobe/x.json"


def test_verls_precision_debugger_config_path_is_taken_from_the_files_folder(tmp_path: Path) -> None:
    (tmp_path / "verl.yaml").write_text(
        "global_profiler:\n"
        "  tool: precision_debugger\n"
        "  steps: [1]\n"
        "  save_path: out\n"
        "  global_tool_config:\n"
        "    precision_debugger:\n"
        "      config_path: dump_config.json\n"
        "actor_rollout_ref:\n"
        "  actor:\n"
        "    profiler:\n"
        "      enable: true\n"
    )
    from verl_events.config import read_config

    raw = read_config(str(tmp_path / "verl.yaml"))
    assert raw["global_profiler"]["global_tool_config"]["precision_debugger"]["config_path"] == str(
        tmp_path / "dump_config.json"
    )
    assert raw["global_profiler"]["save_path"] == "out"


def test_replay_is_a_boolean_and_needs_an_armed_observer() -> None:
    with pytest.raises(ConfigError, match=r"replay: 'yes' is not allowed; use true or false"):
        load_config({"replay": "yes"})
    with pytest.raises(
        ConfigError,
        match=r"replay: true replays a stage for the capture observers an anomaly arms, but no observer "
        r"has trigger: anomaly; add trigger: anomaly to a capture observer",
    ):
        load_config({"replay": True, "observers": [{"name": "sentinel"}, {"name": "msprobe"}]})
    assert load_config({"replay": False}).replay is False
    assert load_config({}).replay is None


def test_a_config_file_that_is_not_a_small_regular_utf8_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO where the config belongs would block a reader forever; a huge file or a binary
    one is not a config: each is one ConfigError naming the file."""
    from verl_events.config import CONFIG_FILE_LIMIT, read_config_text

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"config file '.*fifo.yaml' is not a regular file"):
        load_config(fifo)
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * (CONFIG_FILE_LIMIT + 1))
    with pytest.raises(ConfigError, match=r"huge.yaml' holds \d+ bytes, more than a config file may"):
        load_config(huge)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match=r"msprobe's config is not UTF-8 text \(byte 0\)"):
        read_config_text(binary, "msprobe's config")
    edge = tmp_path / "edge.yaml"
    edge.write_bytes(b"#" * CONFIG_FILE_LIMIT)
    assert len(read_config_text(edge, "edge")) == CONFIG_FILE_LIMIT  # a file of the limit itself is read whole


def billion_laughs(levels: int = 9) -> str:
    """A few lines of YAML whose aliases expand to 9**levels values."""
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_yaml_aliases_that_expand_past_the_limit_are_refused_in_a_file_and_an_override(tmp_path: Path) -> None:
    """An alias bomb (nine lines, 387 million values once expanded) is refused at once, with one
    sentence, wherever YAML is read: the config file, and a command-line override."""
    from verl_events.apps.cli import main

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("save_path: outputs/x\nobservers: []\n" + billion_laughs())
    with pytest.raises(ConfigError, match=r"config file '.*bomb.yaml': its YAML aliases expand to more than 100000"):
        load_config(bomb)
    plain = tmp_path / "plain.yaml"
    plain.write_text("save_path: outputs/x\nobservers:\n  - name: timing\n")
    flow = "{" + billion_laughs().replace("\n", ", ").rstrip(", ") + "}"
    with pytest.raises(ConfigError, match=r"override 'observers.0.steps=.*': its YAML aliases expand"):
        load_config(plain, [f"observers.0.steps={flow}"])
    looped = tmp_path / "looped.yaml"
    looped.write_text("save_path: outputs/x\nobservers: &self [*self]\n")
    with pytest.raises(ConfigError, match=r"expand to more than 100000 values \(or refer to themselves\)"):
        load_config(looped)
    assert main(["check", str(bomb)]) == 2
    shared = tmp_path / "shared.yaml"  # aliases as a real config uses them stay fine
    shared.write_text(
        "save_path: outputs/x\nobservers:\n  - name: timing\n    steps: &steps [1, 2]\n"
        "  - name: sentinel\n    steps: *steps\n"
    )
    assert [spec.selection.steps for spec in load_config(shared).observers] == [frozenset({1, 2})] * 2
