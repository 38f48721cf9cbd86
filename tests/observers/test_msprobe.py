"""MsprobeObserver on real msprobe 26.2 dumps (CPU torch)."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import verl_events
from verl_events import ConfigError, ObserverError, ObserverSetupError, VerlEventsWarning, stage
from verl_events.observers.msprobe import _api as _msprobe_api
from verl_events.observers.msprobe import layout as msprobe_layout
from verl_events.testing import RecordingObserver

from .support import Small, dump_entries, run_model, write_msprobe_config

ACTOR_STAGES = ["actor_compute_log_prob", "actor_update"]
MSPROBE_VERSION = importlib.metadata.version("mindstudio-probe")
# L0 hooks make torch warn about full backward hooks when an input has no grad.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")


def msprobe_config(tmp_path: Path, **observer: object) -> dict[str, object]:
    return {"save_path": str(tmp_path / "out"), "observers": [{"name": "msprobe", **observer}]}


def run_steps(model: Small, steps: range, stages: list[str] = ACTOR_STAGES) -> None:
    for step in steps:
        for name in stages:
            with stage(name, step=step, model=model):
                run_model(model, backward=name.endswith("update"))


def test_each_selected_stage_gets_its_own_dump_at_verls_path(tmp_path: Path, model: Small) -> None:
    with verl_events.install(msprobe_config(tmp_path, steps=[1, 2])):
        run_steps(model, range(1, 4))
    out = tmp_path / "out"
    dumps = sorted(str(p.relative_to(out)) for p in out.rglob("dump.json"))
    assert dumps == [f"step_{s}/{name}/step0/rank0/dump.json" for s in (1, 2) for name in sorted(ACTOR_STAGES)]


def test_dump_json_holds_one_stage_only_and_does_not_grow(tmp_path: Path, model: Small) -> None:
    with verl_events.install(msprobe_config(tmp_path)):
        run_steps(model, range(1, 4))
    out = tmp_path / "out"
    forward_only = [dump_entries(out / f"step_{s}/actor_compute_log_prob/step0/rank0/dump.json") for s in (1, 2, 3)]
    with_backward = [dump_entries(out / f"step_{s}/actor_update/step0/rank0/dump.json") for s in (1, 2, 3)]
    # Same keys every step: counters restart, nothing carried over from earlier stages.
    assert all(entries.keys() == forward_only[0].keys() for entries in forward_only)
    assert all(entries.keys() == with_backward[0].keys() for entries in with_backward)
    assert "Functional.linear.0.forward" in forward_only[2]
    assert not any(key.endswith("backward") for key in forward_only[0])
    assert any(key.endswith("backward") for key in with_backward[0])
    assert len(with_backward[0]) > len(forward_only[0])


def test_torch_functions_are_unwrapped_outside_sessions(tmp_path: Path, model: Small) -> None:
    original = F.linear
    seen_inside = []

    with verl_events.install(msprobe_config(tmp_path)):
        assert F.linear is original
        with stage("actor_update", step=1, model=model):
            seen_inside.append(F.linear)
        assert F.linear is original
    assert seen_inside[0] is not original


def test_a_stage_called_twice_in_one_step_gets_a_second_inner_step(tmp_path: Path, model: Small) -> None:
    with verl_events.install(msprobe_config(tmp_path)):
        run_steps(model, range(1, 2), ["actor_update", "actor_update"])
    stage_dir = tmp_path / "out/step_1/actor_update"
    assert sorted(p.parent.parent.name for p in stage_dir.rglob("dump.json")) == ["step0", "step1"]


def test_unknown_step_goes_to_step_unknown(tmp_path: Path, model: Small) -> None:
    with verl_events.install(msprobe_config(tmp_path)):
        with stage("actor_update", model=model):
            run_model(model)
    assert (tmp_path / "out/step_unknown/actor_update/step0/rank0/dump.json").is_file()


def test_dump_path_in_config_json_is_overridden_with_a_warning(tmp_path: Path, model: Small) -> None:
    config = write_msprobe_config(tmp_path / "cfg.json", dump_path=str(tmp_path / "elsewhere"))
    with pytest.warns(VerlEventsWarning, match="field 'dump_path' is ignored"):
        installation = verl_events.install(msprobe_config(tmp_path, config_path=str(config)))
    with installation:
        run_steps(model, range(1, 2), ["actor_update"])
    assert (tmp_path / "out/step_1/actor_update/step0/rank0/dump.json").is_file()
    assert not (tmp_path / "elsewhere").exists()


def test_a_step_list_in_config_json_is_ignored_with_a_warning(tmp_path: Path, model: Small) -> None:
    config = write_msprobe_config(tmp_path / "cfg.json", step=[0])
    with pytest.warns(VerlEventsWarning, match=r"field 'step' \[0\] is ignored"):
        installation = verl_events.install(msprobe_config(tmp_path, config_path=str(config)))
    with installation:
        run_steps(model, range(1, 4), ["actor_update"])
    # An msprobe step list of [0] would have stopped msprobe after the first session.
    assert len(list((tmp_path / "out").rglob("dump.json"))) == 3


@pytest.mark.parametrize(
    ("contents", "pattern"),
    [
        (None, r"config_path '.*missing.json' cannot be read"),
        ("{not json", r"config_path '.*cfg.json' is not valid JSON at line 1, column 2"),
        (
            '{"task": "overflow_check"}',
            r"field 'task' is 'overflow_check' \(that is an msprobe command-line tool.*allowed: statistics, tensor",
        ),
        ('{"task": "statistics", "level": "L3"}', r"field 'level' is 'L3'; allowed: L0, L1, L2, mix, debug"),
        ("[1, 2]", r"must hold a JSON object"),
    ],
)
def test_bad_config_json_fails_at_install_naming_file_and_field(
    tmp_path: Path, contents: str | None, pattern: str
) -> None:
    name = "missing.json" if contents is None else "cfg.json"
    if contents is not None:
        (tmp_path / name).write_text(contents)
    with pytest.raises(ConfigError, match=pattern):
        verl_events.install(msprobe_config(tmp_path, config_path=str(tmp_path / name)))
    assert verl_events.current_installation() is None


def test_msprobe_rejections_we_do_not_check_ourselves_still_fail_at_install(tmp_path: Path) -> None:
    config = write_msprobe_config(tmp_path / "cfg.json", statistics={"summary_mode": "sha1"})
    with pytest.raises(ConfigError, match=r"config_path '.*cfg.json': msprobe rejected it"):
        verl_events.install(msprobe_config(tmp_path, config_path=str(config)))


@pytest.mark.parametrize("bad_dir", ["with space", "a+b"])
def test_paths_msprobe_would_reject_fail_at_install(tmp_path: Path, bad_dir: str) -> None:
    config = write_msprobe_config(tmp_path / "cfg.json")
    with pytest.raises(ConfigError, match=r"save_path: .* contains characters msprobe rejects"):
        verl_events.install(
            {"save_path": str(tmp_path / bad_dir), "observers": [{"name": "msprobe", "config_path": str(config)}]}
        )
    bad_config = tmp_path / bad_dir / "cfg.json"
    bad_config.parent.mkdir(exist_ok=True)
    write_msprobe_config(bad_config)
    with pytest.raises(ConfigError, match=r"config_path: .* contains characters msprobe rejects"):
        verl_events.install(msprobe_config(tmp_path, config_path=str(bad_config)))


def test_a_save_path_that_cannot_be_created_fails_at_install(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"save_path: '.*a_file/out' cannot be created"):
        verl_events.install({"save_path": str(blocker / "out"), "observers": [{"name": "msprobe"}]})


def test_dumps_from_another_run_are_refused_at_install(
    tmp_path: Path, model: Small, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "first")
    with verl_events.install(msprobe_config(tmp_path)):
        run_steps(model, range(1, 2), ["actor_update"])
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "second")
    with pytest.raises(
        ConfigError,
        match=r"already holds 1 msprobe dump\(s\) from another run \(run 'first'; this is run 'second'\), "
        r"e.g. .*step_1/actor_update/step0/rank0",
    ):
        verl_events.install(msprobe_config(tmp_path))


def test_a_process_joining_its_run_mid_way_is_welcome(
    tmp_path: Path, model: Small, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray worker process started after others have dumped: same run id, same rank 0 before
    torch.distributed is up.  It installs, and dumps its own stages beside the others'."""
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "ray-session_2026-11-30_09-12-44_503511_2710-01000000")
    with verl_events.install(msprobe_config(tmp_path)):
        run_steps(model, range(1, 2), ["actor_update"])
    with verl_events.install(msprobe_config(tmp_path)):
        run_steps(model, range(2, 3), ["actor_update"])
    assert sorted(p.parents[3].name for p in (tmp_path / "out").rglob("dump.json")) == ["step_1", "step_2"]
    assert json.loads((tmp_path / "out/run.json").read_text()) == {
        "run_id": "ray-session_2026-11-30_09-12-44_503511_2710-01000000"
    }


def test_the_save_path_is_claimed_at_the_first_dump_not_at_install(
    tmp_path: Path, model: Small, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's driver installs the observers too and never dumps: it must not claim the save_path."""
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "driver")
    with verl_events.install(msprobe_config(tmp_path)):
        assert not (tmp_path / "out/run.json").exists()
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "workers")
    with verl_events.install(msprobe_config(tmp_path)):
        run_steps(model, range(1, 2), ["actor_update"])
    assert json.loads((tmp_path / "out/run.json").read_text()) == {"run_id": "workers"}


def test_a_dump_directory_appearing_after_install_is_never_overwritten(
    tmp_path: Path, model: Small, caplog: pytest.LogCaptureFixture
) -> None:
    with verl_events.install(msprobe_config(tmp_path)):
        # After the run's claim (its first stage): the session's own mkdir refuses the directory.
        # Before the claim, the claim refuses it (tests/test_claim.py).
        run_steps(model, range(1, 2), ["actor_compute_log_prob"])
        stale = tmp_path / "out/step_1/actor_update/step0/rank0"
        stale.mkdir(parents=True)
        (stale / "dump.json").write_text('{"data": {"from": "another run"}}')
        run_steps(model, range(1, 3), ["actor_update"])
    assert json.loads((stale / "dump.json").read_text()) == {"data": {"from": "another run"}}
    assert "so that two runs never mix in one dump.json" in caplog.text
    assert (tmp_path / "out/step_2/actor_update/step0/rank0/dump.json").is_file()


def test_level_l0_dumps_modules_of_the_stage_model(tmp_path: Path) -> None:
    # msprobe skips a model's first and last submodule at L0 once verl is imported,
    # so look at a middle one.
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    )
    config = write_msprobe_config(tmp_path / "cfg.json", level="L0")
    with verl_events.install(msprobe_config(tmp_path, config_path=str(config))):
        with stage("actor_update", step=1, model=model):
            run_model(model)
    entries = dump_entries(tmp_path / "out/step_1/actor_update/step0/rank0/dump.json")
    assert "Module.1.Linear.forward.0" in entries
    assert not any(key.startswith("Functional.") for key in entries)


def test_l0_without_a_model_warns_once_with_the_paths_tried_and_dumps_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Worker:
        @verl_events.emits_stage("actor_update")
        def update_actor(self) -> int:
            return 1

    config = write_msprobe_config(tmp_path / "cfg.json", level="L0")
    with verl_events.install(msprobe_config(tmp_path, config_path=str(config))):
        assert [Worker().update_actor() for _ in range(2)] == [1, 1]
    warnings = [r.getMessage() for r in caplog.records if "model not resolved" in r.getMessage()]
    assert len(warnings) == 1
    assert "observer 'msprobe' needs one; tried worker attributes actor.engine.module" in warnings[0]
    assert not list((tmp_path / "out").rglob("dump.json"))


def test_l0_without_a_model_is_an_error_in_strict_mode(tmp_path: Path) -> None:
    config = write_msprobe_config(tmp_path / "cfg.json", level="mix")
    ran = []
    with verl_events.install({**msprobe_config(tmp_path, config_path=str(config)), "strict": True}):
        with pytest.raises(ObserverError, match="failed in on_stage_begin for stage 'actor_update'") as raised:
            with stage("actor_update", step=1):
                ran.append(True)
    assert not ran
    assert "level mix needs the model of stage 'actor_update'" in str(raised.value.__cause__)


def test_missing_msprobe_warns_and_turns_the_observer_off(
    tmp_path: Path, model: Small, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "msprobe", None)  # how Python spells "not importable"
    with pytest.warns(
        VerlEventsWarning,
        match=r"msprobe is not installed, so the msprobe observer is off; "
        r"install it with: pip install 'verl-events\[msprobe\]'",
    ):
        installation = verl_events.install(msprobe_config(tmp_path))
    with installation:
        run_steps(model, range(1, 2), ["actor_update"])
    assert not list((tmp_path / "out").rglob("dump.json"))


def test_missing_msprobe_is_an_error_in_strict_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "msprobe", None)
    with pytest.raises(
        ObserverSetupError, match=r"observers\[0\] \(msprobe\) failed to set up: ImportError: msprobe is not installed"
    ):
        verl_events.install({**msprobe_config(tmp_path), "strict": True})


def test_a_nested_stage_is_not_dumped_and_the_warning_names_both(
    tmp_path: Path, model: Small, caplog: pytest.LogCaptureFixture
) -> None:
    with verl_events.install(msprobe_config(tmp_path)):
        with stage("actor_update", step=1, model=model):
            with stage("actor_compute_log_prob", step=1, model=model):
                run_model(model)
    assert (
        "stage 'actor_compute_log_prob' (step 1, depth 1) is not dumped: "
        "stage 'actor_update' (step 1) already has msprobe's one-per-process session open" in caplog.text
    )
    assert [p.parts[-4] for p in (tmp_path / "out").rglob("dump.json")] == ["actor_update"]


def test_a_stage_on_another_thread_never_opens_a_second_session(
    tmp_path: Path, model: Small, caplog: pytest.LogCaptureFixture
) -> None:
    session_open, other_done = threading.Event(), threading.Event()

    def other_thread() -> None:
        session_open.wait()
        with stage("ref_compute_log_prob", step=1, model=model):
            pass
        other_done.set()

    with verl_events.install(msprobe_config(tmp_path)):
        thread = threading.Thread(target=other_thread)
        thread.start()
        with stage("actor_update", step=1, model=model):
            session_open.set()
            other_done.wait()
            run_model(model)
        thread.join()
    assert "stage 'ref_compute_log_prob' (step 1, depth 0) is not dumped: stage 'actor_update' (step 1)" in caplog.text
    assert not (tmp_path / "out/step_1/ref_compute_log_prob").exists()


def test_a_failed_msprobe_start_leaves_msprobe_clean(
    tmp_path: Path, model: Small, caplog: pytest.LogCaptureFixture
) -> None:
    runs = []
    with verl_events.install(msprobe_config(tmp_path)):
        blocker = tmp_path / "out/step_1/actor_update"
        blocker.parent.mkdir(parents=True)
        blocker.write_text("a file where msprobe wants a directory")
        with stage("actor_update", step=1, model=model):
            runs.append(1)
            run_model(model)  # msprobe must not try to record into the failed session
        run_steps(model, range(2, 3), ["actor_update"])
    assert runs == [1]
    assert "observer 'msprobe' failed in on_stage_begin for stage 'actor_update' (step 1" in caplog.text
    assert len(dump_entries(tmp_path / "out/step_2/actor_update/step0/rank0/dump.json")) > 0


def test_another_observer_failing_inside_a_dumped_stage_still_closes_the_session(tmp_path: Path, model: Small) -> None:
    broken = RecordingObserver(fail_on="begin")
    broken.name = "broken"
    with verl_events.install(msprobe_config(tmp_path), observers=[broken]):
        run_steps(model, range(1, 3), ["actor_update"])
    for step in (1, 2):
        assert dump_entries(tmp_path / f"out/step_{step}/actor_update/step0/rank0/dump.json")


def test_a_raising_stage_body_closes_the_session_and_the_next_stage_dumps(tmp_path: Path, model: Small) -> None:
    with verl_events.install(msprobe_config(tmp_path)):
        with pytest.raises(ZeroDivisionError):
            with stage("actor_update", step=1, model=model):
                run_model(model)
                1 / 0  # noqa: B018  (the stage must raise)
        run_steps(model, range(2, 3), ["actor_update"])
    first = dump_entries(tmp_path / "out/step_1/actor_update/step0/rank0/dump.json")
    second = dump_entries(tmp_path / "out/step_2/actor_update/step0/rank0/dump.json")
    assert first.keys() == second.keys()
    # The dump of the raising stage is kept, and marked: it is not a whole stage.
    assert (tmp_path / "out/step_1/actor_update/step0/rank0/session.incomplete").read_text() == (
        "step 1 actor_update (rank 0) raised ZeroDivisionError; the dump holds the stage only up to there\n"
    )
    assert not (tmp_path / "out/step_2/actor_update/step0/rank0/session.incomplete").exists()


def test_a_second_installation_applies_its_own_config_to_msprobes_singleton(tmp_path: Path, model: Small) -> None:
    with verl_events.install(msprobe_config(tmp_path / "a")):
        run_steps(model, range(1, 2), ["actor_update"])
    l0 = write_msprobe_config(tmp_path / "l0.json", level="L0")
    with verl_events.install(msprobe_config(tmp_path / "b", config_path=str(l0))):
        run_steps(model, range(1, 2), ["actor_update"])
    first = json.loads((tmp_path / "a/out/step_1/actor_update/step0/rank0/dump.json").read_text())
    second = json.loads((tmp_path / "b/out/step_1/actor_update/step0/rank0/dump.json").read_text())
    assert (first["level"], second["level"]) == ("L1", "L0")


def test_precision_debugger_is_an_alias(tmp_path: Path) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "precision_debugger"}]}) as inst:
        assert type(inst.observers[0]).__name__ == "MsprobeObserver"


def test_keep_api_hooks_leaves_msprobes_wrappers_between_sessions(tmp_path: Path, model: Small) -> None:
    original = F.linear
    with verl_events.install(msprobe_config(tmp_path / "keep", keep_api_hooks=True)):
        run_steps(model, range(1, 3), ["actor_update"])
        assert F.linear is not original  # still msprobe's wrapper, as verl leaves it
    assert len(list((tmp_path / "keep").rglob("dump.json"))) == 2
    with verl_events.install(msprobe_config(tmp_path / "default")):
        assert F.linear is original  # the next installation takes them off again


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_keeps_msprobe_off_stdout(tmp_path: Path, quiet: bool) -> None:
    # A fresh interpreter: msprobe's log level is process-wide, set once.
    script = f"""
import torch, verl_events
model = torch.nn.Linear(4, 1)
with verl_events.install({{"save_path": {str(tmp_path)!r}, "observers": [{{"name": "msprobe", "quiet": {quiet}}}]}}):
    with verl_events.stage("actor_update", step=1, model=model):
        model(torch.ones(2, 4)).sum().backward()
print("done")
"""
    env = {key: value for key, value in os.environ.items() if key != "MSPROBE_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert "MSPROBE_LOG_LEVEL" not in os.environ  # quieting msprobe must not leak into child processes
    chatter = [line for line in result.stdout.splitlines() if line != "done"]
    assert (chatter == []) is quiet, chatter


@pytest.mark.parametrize("level", ["L1", "L0", "mix"])
def test_the_warm_up_session_at_install_leaves_no_trace(tmp_path: Path, level: str) -> None:
    """msprobe's one-off set-up is paid at install, in a throw-away session: nothing of it
    stays on disk, and the first real dump holds the same entries as without it."""
    # Four layers: at L0 msprobe skips a model's first and last submodule once verl is imported.
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    )
    entries = {}
    for warm_up in (True, False):
        out = tmp_path / f"warm_up_{warm_up}"
        config_path = write_msprobe_config(out.with_suffix(".json"), level=level)
        config = {
            "save_path": str(out),
            "observers": [{"name": "msprobe", "config_path": str(config_path), "warm_up": warm_up}],
        }
        with verl_events.install(config):
            assert sorted(p.name for p in out.iterdir()) == []
            with stage("actor_update", step=1, model=model):
                run_model(model)
        assert sorted(p.name for p in out.iterdir()) == ["run.json", "step_1"]
        entries[warm_up] = sorted(json.loads((out / "step_1/actor_update/step0/rank0/dump.json").read_text())["data"])
    assert entries[True] == entries[False] and entries[True]


def test_each_stage_dumps_under_its_own_rank_after_the_warm_up(
    tmp_path: Path, model: Small, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msprobe fixes the rank at its first start, which is now the warm-up at install, when
    a Ray worker may not know its rank yet; every stage still dumps under the rank it ran on."""
    with verl_events.install(msprobe_config(tmp_path)):
        monkeypatch.setenv("RANK", "3")
        run_steps(model, range(1, 2), ["actor_update"])
        monkeypatch.setenv("RANK", "5")
        run_steps(model, range(2, 3), ["actor_update"])
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("dump.json")) == [
        "step_1/actor_update/step0/rank3/dump.json",
        "step_2/actor_update/step0/rank5/dump.json",
    ]


class TorchWorkOnEnd(verl_events.Observer):
    """An observer doing torch work in its hooks, at the default priority."""

    def on_stage_begin(self, event: verl_events.StageEvent) -> None:
        torch.ones(3).cumsum(0)

    def on_stage_end(self, event: verl_events.StageEnd) -> None:
        torch.ones(3).cumsum(0)


def test_another_observers_torch_work_never_lands_in_the_dump(tmp_path: Path, model: Small) -> None:
    config = msprobe_config(tmp_path)
    config["observers"].append({"_target_": "tests.observers.test_msprobe:TorchWorkOnEnd"})  # type: ignore[attr-defined]
    with verl_events.install(config):
        run_steps(model, range(1, 2), ["actor_update"])
    entries = json.loads((tmp_path / "out/step_1/actor_update/step0/rank0/dump.json").read_text())["data"]
    assert entries and not [name for name in entries if "cumsum" in name]


# -- the adapter: one place that imports msprobe, checked at install ----------------


def missing_message(*named: str) -> str:
    return (
        f"observers[0] (msprobe) failed to set up: ObserverSetupError: msprobe {MSPROBE_VERSION} (mindstudio-probe) "
        f"lacks what the verl_events msprobe observer relies on: {'; '.join(named)}. verl_events is written against "
        "mindstudio-probe>=26.2,<27; install a supported version with: pip install 'verl-events[msprobe]'"
    )


def test_the_probe_passes_on_the_installed_msprobe(tmp_path: Path) -> None:
    assert MSPROBE_VERSION.startswith("26.2.")
    api = _msprobe_api.probe_debugger_api(quiet=True)
    with verl_events.install(msprobe_config(tmp_path, warm_up=False)):
        _msprobe_api.probe_debugger(api, api.precision_debugger._instance)


@pytest.mark.parametrize(
    ("owner", "name", "named"),
    [
        (
            "msprobe.pytorch.dump.debugger.debugger_config",
            "DebuggerConfig",
            "msprobe.pytorch.dump.debugger.debugger_config.DebuggerConfig",
        ),
        (
            "msprobe.core.dump.debugger.precision_debugger:BasePrecisionDebugger",
            "set_init_step",
            "msprobe.pytorch.PrecisionDebugger.set_init_step",
        ),
        (
            "msprobe.core.dump.service:BaseService",
            "_is_need_api_hook",
            "msprobe.pytorch.dump.pytorch_service.PytorchService._is_need_api_hook",
        ),
        ("msprobe.core.common.runtime:Runtime", "is_running", "msprobe.core.common.runtime.Runtime.is_running"),
        # Set on the built debugger, so checked on it: msprobe's singleton exists (see below).
        (
            "msprobe.core.dump.api_dump.api_registry:ApiRegistry",
            "restore_all_api",
            "PrecisionDebugger().service.api_register.restore_all_api",
        ),
    ],
)
def test_an_msprobe_without_an_internal_we_use_fails_setup_naming_the_version_and_the_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, owner: str, name: str, named: str
) -> None:
    with verl_events.install(msprobe_config(tmp_path / "first", warm_up=False)):
        pass  # msprobe's singleton now exists, as after any earlier installation in a process
    module, _, cls = owner.partition(":")
    target = importlib.import_module(module)
    monkeypatch.delattr(getattr(target, cls) if cls else target, name)
    with pytest.raises(ObserverSetupError, match=re.escape(missing_message(named))):
        verl_events.install(msprobe_config(tmp_path / "second", warm_up=False))
    assert verl_events.current_installation() is None


def test_every_missing_internal_is_named_in_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from msprobe.core.common.runtime import Runtime
    from msprobe.pytorch.dump.debugger import debugger_config

    monkeypatch.delattr(debugger_config, "DebuggerConfig")
    monkeypatch.delattr(Runtime, "is_running")
    with pytest.raises(
        ObserverSetupError,
        match=re.escape(
            missing_message(
                "msprobe.pytorch.dump.debugger.debugger_config.DebuggerConfig",
                "msprobe.core.common.runtime.Runtime.is_running",
            )
        ),
    ):
        verl_events.install({**msprobe_config(tmp_path), "strict": True})


def takes_step_and_loop(cls: type, step: int, loop: int) -> None:
    """set_init_step as a later msprobe might define it."""


def start_on_the_instance(self: object, model: object = None, rank_id: object = None) -> None:
    """start as an instance method, which the observer cannot call on the class."""


@pytest.mark.parametrize(
    ("owner", "name", "replacement", "named"),
    [
        (
            "BasePrecisionDebugger",
            "set_init_step",
            classmethod(takes_step_and_loop),
            "msprobe.pytorch.PrecisionDebugger.set_init_step(step): "
            "it is msprobe.pytorch.PrecisionDebugger.set_init_step(step, loop)",
        ),
        (
            "PrecisionDebugger",
            "start",
            start_on_the_instance,
            "msprobe.pytorch.PrecisionDebugger.start as a classmethod: it is a function",
        ),
    ],
)
def test_an_internal_of_another_shape_fails_setup_showing_what_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, owner: str, name: str, replacement: object, named: str
) -> None:
    from msprobe.core.dump.debugger.precision_debugger import BasePrecisionDebugger
    from msprobe.pytorch import PrecisionDebugger

    monkeypatch.setattr(
        {"BasePrecisionDebugger": BasePrecisionDebugger, "PrecisionDebugger": PrecisionDebugger}[owner],
        name,
        replacement,
    )
    with pytest.raises(ObserverSetupError, match=re.escape(missing_message(named))):
        verl_events.install(msprobe_config(tmp_path, warm_up=False))


def test_only_the_adapter_names_msprobe_modules() -> None:
    """No module of the package but observers/msprobe/_api.py imports msprobe, or
    names one of its modules (as importlib.import_module would need)."""
    observers = Path(msprobe_layout.__file__).parent.parent
    roots = [Path(verl_events.__file__).parent, observers]
    imported = re.compile(r"^msprobe(\.|$)")
    named = re.compile(r"^msprobe(\.\w+)+$")  # a module path, not the word (a logger or resource name)
    offenders = []
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        if path == observers / "msprobe" / "_api.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names if imported.match(alias.name)]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found = [node.module or ""] if imported.match(node.module or "") else []
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found = [node.value] if named.match(node.value) else []
            else:
                continue
            offenders += [f"{path}:{node.lineno}: {name}" for name in found]
    assert offenders == []


# -- msprobe_layout: where a session's files are ------------------------------------------


def test_msprobe_writes_each_session_where_msprobe_layout_says(tmp_path: Path, model: Small) -> None:
    with verl_events.install(msprobe_config(tmp_path)):
        run_steps(model, range(1, 2), ["actor_update", "actor_update"])
    stage_dir = tmp_path / "out/step_1/actor_update"
    assert msprobe_layout.holds_sessions(stage_dir)
    assert not msprobe_layout.holds_sessions(tmp_path / "out")  # our step_1 is not msprobe's step{k}
    for call in (0, 1):
        assert msprobe_layout.rank_dirs(msprobe_layout.step_dir(stage_dir, call)) == [
            msprobe_layout.session_dir(stage_dir, call, 0)
        ]
        dump = msprobe_layout.dump_file(msprobe_layout.session_dir(stage_dir, call, 0))
        entries = dump_entries(dump)
        stacks = json.loads(msprobe_layout.stack_file(dump).read_text())
        # stack.json: {index: [[entry names], [stack lines]]}; every forward call has one.
        assert {name for names, _ in stacks.values() for name in names} >= {
            n for n in entries if n.endswith(".forward")
        }
        assert json.loads(msprobe_layout.construct_file(dump).read_text()) == {}  # level L1: no modules
    assert msprobe_layout.proc_dirs(msprobe_layout.step_dir(stage_dir, 0)) == []


def test_stack_file_is_found_beside_a_dump_json_only() -> None:
    assert msprobe_layout.stack_file(Path("s/step0/rank0/dump.json")) == Path("s/step0/rank0/stack.json")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "'s/step0/rank0' is not an msprobe dump.json; stack.json is found beside a session's dump.json"
        ),
    ):
        msprobe_layout.stack_file(Path("s/step0/rank0"))


def test_a_packaged_config_is_read_wherever_the_package_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msprobe reads a private copy of the config, never the package's file, so a
    site-packages path with characters msprobe rejects must not refuse the default."""
    from verl_events.observers.msprobe import _config

    odd = tmp_path / "py3.11+cpu" / "configs"
    odd.mkdir(parents=True)
    (odd / "statistics_L1.json").write_text((_config.PACKAGED / "statistics_L1.json").read_text())
    monkeypatch.setattr(_config, "PACKAGED", odd)
    assert _config.read_msprobe_config(None).level == "L1"
    assert _config.read_msprobe_config("statistics_L1").source == str(odd / "statistics_L1.json")
    mine = odd.parent / "mine.json"
    mine.write_text((odd / "statistics_L1.json").read_text())
    with pytest.raises(ConfigError, match="contains characters msprobe rejects"):
        _config.read_msprobe_config(str(mine))  # a config of the user's: checked as before
