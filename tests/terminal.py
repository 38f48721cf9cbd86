"""Running a command in a terminal window of a given width (a pseudo-terminal), as a user does."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def run_in_terminal(args: list[str], columns: int, timeout: float) -> tuple[int, str]:
    """Runs ``args`` with stdout and stderr on one pseudo-terminal ``columns`` wide
    (``COLUMNS`` and ``LINES`` unset, so the window's size is what counts); returns the
    exit status and everything it wrote, terminal escapes and carriage returns removed.
    Raises ``subprocess.TimeoutExpired`` (after killing it) past ``timeout`` seconds."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                process.kill()
                process.wait()
                raise subprocess.TimeoutExpired(args, timeout)
            ready, _, _ = select.select([master], [], [], left)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        status = process.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        os.close(master)
    return status, _ESCAPES.sub("", b"".join(chunks).decode(errors="replace"))
