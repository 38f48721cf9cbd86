"""Ctrl-C while observers are built and set up stays a Ctrl-C.

The signal is real in every test: ``signal.raise_signal`` in this process
(its handler runs before ``raise_signal`` returns, so the interrupt lands
exactly inside the observer's set-up), or ``os.kill`` from this process into
a child that waits inside a real import for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import pytest

import verl_events
from verl_events import Observer, ObserverSetupError, install
from verl_events.setup.interrupts import keeping_interrupts
from verl_events.testing import RecordingObserver


class InterruptedObserver(Observer):
    """Its set-up is interrupted by a real SIGINT; ``then`` says what the set-up
    code makes of the KeyboardInterrupt, as tool libraries do."""

    def __init__(self, then: str) -> None:
        self.then = then
        self.closed = False

    def setup(self, context: verl_events.InstallContext) -> None:
        try:
            signal.raise_signal(signal.SIGINT)
        except BaseException as exc:
            if self.then == "raise KeyError":  # a half-initialised package's next import
                raise KeyError("tool.backend") from exc
            if self.then == "propagate":
                raise
            # "swallow": a bare except around an optional backend

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("then", ["raise KeyError", "swallow", "propagate"])
def test_an_interrupt_during_setup_ends_install_by_keyboardinterrupt_however_the_setup_took_it(then: str) -> None:
    first = RecordingObserver()
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        install(observers=[first, InterruptedObserver(then)])
    assert first.closed, "the observer set up before the interrupt is closed"
    assert verl_events.current_installation() is None
    assert signal.getsignal(signal.SIGINT) is handler


def test_the_interrupt_names_the_exception_it_surfaced_as() -> None:
    with pytest.raises(KeyboardInterrupt, match=r"it surfaced as ObserverSetupError: .*KeyError: 'tool.backend'"):
        install(observers=[InterruptedObserver("raise KeyError")])


def test_a_failing_setup_without_an_interrupt_is_still_an_observer_setup_error() -> None:
    class Failing(Observer):
        def setup(self, context: verl_events.InstallContext) -> None:
            raise KeyError("tool.backend")

    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(ObserverSetupError, match=r"failed to set up: KeyError: 'tool.backend'"):
        install(observers=[Failing()])
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_sigint_handler_that_does_not_raise_is_called_and_the_install_goes_on() -> None:
    """A user's handler that only asks for a graceful stop decides, not us."""
    asked: list[int] = []

    def graceful_stop(signum: int, frame: FrameType | None) -> None:
        asked.append(signum)

    previous = signal.signal(signal.SIGINT, graceful_stop)
    try:
        with install(observers=[InterruptedObserver("propagate")]) as installation:
            assert installation.observers
        assert asked == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is graceful_stop
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_handler_installed_during_the_block_is_left_in_place() -> None:
    """An observer that chains its own handler (the watchdog does) keeps it after set-up."""
    previous = signal.getsignal(signal.SIGINT)
    theirs = None
    try:
        with keeping_interrupts("testing"):
            chained = signal.getsignal(signal.SIGINT)
            assert callable(chained)

            def theirs(signum: int, frame: FrameType | None) -> None:
                chained(signum, frame)

            signal.signal(signal.SIGINT, theirs)
        assert signal.getsignal(signal.SIGINT) is theirs
        with pytest.raises(KeyboardInterrupt):  # the chain still ends in Python's own handler
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_after_an_install_with_the_watchdog_the_users_own_handler_is_back(tmp_path: Path) -> None:
    """The watchdog chains its handler during set-up and puts back the one it found
    (the set-up's wrapper) when it closes; uninstall then puts the user's own back."""
    previous = signal.getsignal(signal.SIGINT)

    def users_own(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, users_own)
    try:
        with install({"save_path": str(tmp_path), "observers": [{"name": "watchdog"}]}):
            assert signal.getsignal(signal.SIGINT) is not users_own  # the watchdog's, in front
        assert signal.getsignal(signal.SIGINT) is users_own
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted_once(
    args: list[str], marker: Path, env: dict[str, str], what: str, timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Start ``args``, wait until ``marker`` says ``what``'s import has begun, send SIGINT,
    and return how the process ended (killed if it outlives ``timeout``)."""
    process = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert marker.exists(), f"{what}'s import never began: {process.communicate()}"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


# -- a real import, interrupted from another process --------------------------------

#: A tool package with an optional backend behind a bare except, as some libraries
#: have: the interrupt that lands in the backend's import leaves the package
#: half-initialised (``_backend`` is None) instead of propagating.
HALFTOOL_INIT = """
try:
    from . import _backend
except BaseException:
    _backend = None
"""

#: The backend's import takes a while (as msprobe's does); the marker tells the
#: test that the import is under way.
HALFTOOL_BACKEND = """
import os, time
open(os.environ["IMPORT_MARKER"], "w").close()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.01)

def start():
    return "started"
"""

#: Two ways a tool's observer meets the half-initialised package: calling into
#: it (an AttributeError, which the registry's guard would make a failed
#: set-up), or switching itself off with a warning (and the run would go on).
TOOL_OBSERVER = """
import warnings
from verl_events import Observer

class ToolObserver(Observer):
    def __init__(self, when_missing: str = "call") -> None:
        self.when_missing = when_missing

    def setup(self, context):
        import halftool
        if halftool._backend is None and self.when_missing == "switch off":
            warnings.warn("halftool's backend is missing, so this observer is off")
            return
        halftool._backend.start()
"""

SCRIPT = """
import sys
import verl_events
config = {{"observers": [{{"_target_": "tool_observer:ToolObserver", "when_missing": {when_missing!r}}}]}}
with verl_events.install(config):
    with verl_events.stage("actor_update", step=1):
        pass
print("finished")
"""


def _interrupt_during_import(tmp_path: Path, when_missing: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "halftool").mkdir()
    (tmp_path / "halftool/__init__.py").write_text(HALFTOOL_INIT)
    (tmp_path / "halftool/_backend.py").write_text(HALFTOOL_BACKEND)
    (tmp_path / "tool_observer.py").write_text(TOOL_OBSERVER)
    (tmp_path / "script.py").write_text(SCRIPT.format(when_missing=when_missing))
    marker = tmp_path / "importing"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "IMPORT_MARKER": str(marker)}
    args = [sys.executable, str(tmp_path / "script.py")]
    return interrupted_once(args, marker, env, "the backend", timeout=60, cwd=tmp_path)


@pytest.mark.parametrize("when_missing", ["call", "switch off"])
def test_sigint_during_a_tools_import_ends_the_process_by_the_interrupt(tmp_path: Path, when_missing: str) -> None:
    done = _interrupt_during_import(tmp_path, when_missing)
    # Python ends on an uncaught KeyboardInterrupt by SIGINT itself (the shell's 130).
    assert done.returncode == -signal.SIGINT, done
    assert "finished" not in done.stdout
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("KeyboardInterrupt: interrupted while"), done.stderr


#: Put on PYTHONPATH as sitecustomize: the import of one module (SLOW_IMPORT) waits
#: for the interrupt, so that it lands half-way through a real package's import.
SLOW_IMPORT_SITECUSTOMIZE = """
import os, sys, time

class _SlowImport:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["SLOW_IMPORT"] and not os.path.exists(os.environ["IMPORT_MARKER"]):
            open(os.environ["IMPORT_MARKER"], "w").close()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.01)
        return None

sys.meta_path.insert(0, _SlowImport())
"""


def test_ctrl_c_while_the_demo_imports_msprobe_ends_the_demo_as_interrupted(tmp_path: Path) -> None:
    """The newcomer's case: Ctrl-C in the first seconds of ``verl-events demo``,
    while msprobe's package is half imported (in the middle of msprobe.pytorch).
    From this point msprobe passes the interrupt on as it is; the halftool tests
    above are the cases where an import makes something else of it."""
    pytest.importorskip("torch")
    pytest.importorskip("msprobe")
    from .support import verl_events_exe

    (tmp_path / "site").mkdir()
    (tmp_path / "site/sitecustomize.py").write_text(SLOW_IMPORT_SITECUSTOMIZE)
    marker = tmp_path / "importing"
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "site"),
        "IMPORT_MARKER": str(marker),
        "SLOW_IMPORT": "msprobe.pytorch.reproducibility",
    }
    args = [verl_events_exe(), "demo", "--steps", "1", "--save-path", str(tmp_path / "run")]
    process = interrupted_once(args, marker, env, "msprobe.pytorch", timeout=120)
    stdout, stderr = process.stdout, process.stderr
    assert (process.returncode, stderr.strip().splitlines()[-1:]) == (130, ["verl-events: interrupted"]), stderr
    assert "finished" not in stdout
    assert "error:" not in stderr
