"""Real processes for the fault tests: the driver (driver.py), ``verl-events demo``
and the ``verl-events`` readers, with line handshakes on stdout and stdin."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from ..support import verl_events_exe

FAULTS = Path(__file__).parent
DRIVER = FAULTS / "driver.py"
TIMEOUT_S = 180  # generous: the whole suite takes about a minute on two cores
MARKER = "session.incomplete"


class Child:
    """A process the test talks to.  Its stdout and stderr are read by
    threads, so neither pipe can fill and stall it; :meth:`wait_for` returns
    the first stdout line starting with a prefix."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(FAULTS), os.environ.get("PYTHONPATH")])),
                **(env or {}),
            },
        )
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout_lines, self._new), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr_lines, None), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], lines: list[str], new: queue.Queue[str | None] | None) -> None:
        with stream:
            for line in stream:
                lines.append(line)
                if new is not None:
                    new.put(line)
        if new is not None:
            new.put(None)

    def wait_for(self, prefix: str) -> str:
        while True:
            try:
                line = self._new.get(timeout=TIMEOUT_S)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no {prefix!r} line within {TIMEOUT_S} s; stderr:\n{self.stderr}") from None
            if line is None:
                self.finish()
                raise AssertionError(
                    f"the process ended (exit {self.proc.returncode}) before printing {prefix!r}; "
                    f"stderr:\n{self.stderr}"
                )
            if line.startswith(prefix):
                return line.rstrip("\n")

    def go_on(self) -> None:
        """Answer a handshake: the line the process waits for on stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        try:
            self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        finally:
            for reader in self._readers:
                reader.join(timeout=TIMEOUT_S)
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        return self.proc.returncode

    @property
    def stdout(self) -> str:
        return "".join(self.stdout_lines)

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)


def driver(save_path: Path, *args: str, env: dict[str, str] | None = None) -> Child:
    return Child([sys.executable, str(DRIVER), str(save_path), *args], env)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """A ``verl-events`` command, run to its end."""
    return subprocess.run([verl_events_exe(), *args], capture_output=True, text=True, timeout=TIMEOUT_S)


def check_save_path(tmp_path: Path, save_path: Path) -> subprocess.CompletedProcess[str]:
    """``verl-events check`` on a config that points at ``save_path``."""
    config = tmp_path / "check.yaml"
    config.write_text(f"save_path: {save_path}\nobservers:\n  - name: timing\n  - name: msprobe\n")
    return cli("check", str(config))


def session(save_path: Path, step: int, stage: str) -> Path:
    """The rank directory of one msprobe session."""
    return save_path / f"step_{step}" / stage / "step0" / "rank0"


def marker(rank_dir: Path) -> str | None:
    """The ``session.incomplete`` marker's reason, or None when the session is whole."""
    path = rank_dir / MARKER
    return path.read_text(encoding="utf-8").strip() if path.exists() else None


def markers_under(save_path: Path) -> list[Path]:
    return sorted(path.parent for path in save_path.rglob(MARKER))


def entries(rank_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((rank_dir / "dump.json").read_text(encoding="utf-8"))["data"]
    return data


def timing_lines(save_path: Path) -> list[str]:
    return (save_path / "timing" / "rank0.jsonl").read_text(encoding="utf-8").splitlines()


def log_records(stderr: str) -> list[str]:
    """stderr split into log records: a ``LEVEL logger: message`` line and the
    traceback lines that follow it."""
    records: list[str] = []
    for line in stderr.splitlines():
        if line.split(" ", 1)[0] in ("ERROR", "WARNING", "INFO", "CRITICAL") or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    return records
