from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import verl_events
from verl_events import ConfigError, Observer, ObserverError, ObserverSetupError, VerlEventsWarning, install, stage
from verl_events.testing import RecordingObserver


def test_install_returns_a_handle_that_closes_observers_and_disconnects() -> None:
    rec = RecordingObserver()
    inst = install(observers=[rec])
    assert verl_events.current_installation() is inst
    inst.close()
    assert rec.closed and inst.closed
    assert verl_events.current_installation() is None
    assert not verl_events.stage_begin.receivers
    with stage("actor_update", step=1) as event:
        assert event is None


def test_close_twice_is_harmless() -> None:
    rec = RecordingObserver()
    inst = install(observers=[rec])
    inst.close()
    inst.close()
    assert rec.closed


def test_install_twice_is_an_error_naming_the_open_installation() -> None:
    with install(observers=[RecordingObserver()]):
        with pytest.raises(
            RuntimeError,
            match=r"already installed in this process \(<Installation \[RecordingObserver\]>\); "
            r"close that handle first",
        ):
            install()


def test_install_again_after_close_works() -> None:
    with install(observers=[RecordingObserver()]):
        pass
    with install(observers=[RecordingObserver()]) as inst:
        assert not inst.closed


def test_disabled_entries_are_not_built() -> None:
    with install({"observers": [{"name": "recording", "enabled": False}, {"name": "recording"}]}) as inst:
        assert [o.name for o in inst.observers] == ["recording"]


def test_duplicate_names_get_a_suffix() -> None:
    with install({"observers": [{"name": "recording"}, {"name": "recording"}]}) as inst:
        assert [o.name for o in inst.observers] == ["recording", "recording#2"]


class FailsToClose(Observer):
    def close(self) -> None:
        raise RuntimeError("cannot flush")


def test_a_failing_close_is_logged_and_the_others_still_close(caplog: pytest.LogCaptureFixture) -> None:
    rec = RecordingObserver()
    with install(observers=[rec, FailsToClose()]):
        pass
    assert rec.closed
    assert "observer 'FailsToClose' failed to close: RuntimeError: cannot flush" in caplog.text


def test_a_failing_close_raises_in_strict_mode_after_closing_the_others() -> None:
    rec = RecordingObserver()
    inst = install({"strict": True}, observers=[rec, FailsToClose()])
    with pytest.raises(ObserverError, match="observer 'FailsToClose' failed to close"):
        inst.close()
    assert rec.closed


CLOSED: list[str] = []


class RecordsClose(Observer):
    def close(self) -> None:
        CLOSED.append(self.name)


class SetupFails(Observer):
    def setup(self, context: verl_events.InstallContext) -> None:
        raise RuntimeError("no disk")


def test_a_failed_install_closes_what_it_had_built() -> None:
    CLOSED.clear()
    with pytest.raises(ObserverSetupError, match=r"observer 'SetupFails' failed to set up: RuntimeError: no disk"):
        install({"observers": [{"_target_": "tests.test_install:RecordsClose"}]}, observers=[SetupFails()])
    assert CLOSED == ["tests.test_install:RecordsClose"]
    assert verl_events.current_installation() is None
    assert not verl_events.stage_begin.receivers


def test_close_happens_at_interpreter_exit(tmp_path: Path) -> None:
    marker = tmp_path / "closed"
    script = f"""
import pathlib, verl_events
class Marks(verl_events.Observer):
    def close(self):
        pathlib.Path({str(marker)!r}).write_text("yes")
verl_events.install(observers=[Marks()])
"""
    subprocess.run([sys.executable, "-c", script], check=True)
    assert marker.read_text() == "yes"


class Kineto(Observer):
    exclusive_resources = frozenset({"kineto"})


def claim(name: str, **selection: object) -> Observer:
    observer = Kineto()
    observer.name = name
    observer.selection = verl_events.Selection.parse(**selection)  # type: ignore[arg-type]
    return observer


def test_two_observers_on_one_exclusive_resource_and_overlapping_stages_are_rejected() -> None:
    with pytest.raises(
        verl_events.ConfigError,
        match=r"observers 'torch_profiler' and 'npu' both need 'kineto' "
        r"\(the torch profiler's one Kineto session per process\) on overlapping stages",
    ):
        install(observers=[claim("torch_profiler", steps=[1, 2]), claim("npu", steps=["2-3"])])
    assert verl_events.current_installation() is None


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"steps": [1]}, {"steps": [2]}),
        ({"stages": ["actor_update"]}, {"stages": ["critic_update"]}),
        ({"ranks": [0]}, {"ranks": [1]}),
    ],
)
def test_disjoint_selections_may_share_a_resource(first: dict, second: dict) -> None:  # type: ignore[type-arg]
    with install(observers=[claim("a", **first), claim("b", **second)]) as inst:
        assert len(inst.observers) == 2


def test_two_msprobe_observers_on_the_same_steps_are_rejected(tmp_path: Path) -> None:
    pytest.importorskip("msprobe")
    config = {
        "save_path": str(tmp_path),
        "observers": [{"name": "msprobe", "steps": [1]}, {"name": "msprobe", "steps": [1, 2]}],
    }
    with pytest.raises(verl_events.ConfigError, match=r"observers 'msprobe' and 'msprobe#2' both need 'msprobe'"):
        install(config)


def test_an_empty_config_file_says_nothing_will_be_observed(tmp_path: Path) -> None:
    empty = tmp_path / "observers.yaml"
    empty.write_text("")
    with pytest.warns(
        VerlEventsWarning, match=rf"config '{re.escape(str(empty))}' has no observers; nothing will be observed"
    ):
        verl_events.install(empty).close()


def test_an_empty_config_is_an_error_when_strict() -> None:
    with pytest.raises(ConfigError, match=r"the config has no observers; nothing will be observed"):
        verl_events.install({"strict": True})


def test_check_and_install_build_the_same_observers_with_the_same_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_events.apps.cli import main
    from verl_events.config import build_observers, load_config

    config = tmp_path / "observers.yaml"
    config.write_text(
        f"save_path: {tmp_path / 'out'}\n"
        "observers:\n"
        "  - name: recording\n"
        "  - name: timing\n"
        "  - name: recording\n"
        "    steps: [2]\n"
        "  - name: recording\n"
        "    enabled: false\n"
    )
    assert main(["check", str(config)]) == 0
    listed = re.findall(r"^  (\S+) +priority=", capsys.readouterr().out, flags=re.MULTILINE)
    built = [o.name for o in build_observers(load_config(str(config)), set_up=False)]
    with install(str(config)) as installation:
        installed = sorted(o.name for o in installation.observers)  # install lists them in begin order
    assert listed == built == ["recording", "timing", "recording#2"]
    assert installed == sorted(built)


class WarnsAtSetup(Observer):
    def setup(self, context: verl_events.InstallContext) -> None:
        import warnings

        warnings.warn("the tool is off", VerlEventsWarning, stacklevel=2)


def test_a_warning_from_an_observers_setup_points_at_the_line_that_installed() -> None:
    with pytest.warns(VerlEventsWarning, match="the tool is off") as said:
        install(observers=[WarnsAtSetup()]).close()
    assert [Path(w.filename).name for w in said] == [Path(__file__).name]


def test_the_demo_without_torch_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_events.apps.cli import main

    for name in [m for m in sys.modules if m == "torch" or m.startswith(("torch.", "verl_events.apps.demo.tiny"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert main(["demo", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the demo needs torch") and err.count("\n") == 1 and "Traceback" not in err


def test_the_cli_says_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    from verl_events.apps.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"verl-events {version('verl-events')}\n"
