"""This process's run id, and the id shared by an installation's observers.

:func:`run_id` resolves the id every process of a run agrees on, in the order
:mod:`verl_events.run.identity` explains (Ray, ``$VERL_EVENTS_RUN_ID``, torchrun, a
rendezvous, else a new id).  It lives here, below the run folder, because every record an
observer writes carries it: observers get it from their :class:`~verl_events.InstallContext`
as :class:`RunIdOnce`, resolved at the first record and the same for all of them after.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable

from .process import PROCESS

__all__ = ["RUN_ID_ENV", "RunIdOnce", "run_id", "safe_in_a_file_name"]

RUN_ID_ENV = PROCESS.run_id_env


def run_id() -> str:
    """This process's run id (see :mod:`verl_events.run.identity` for the order)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        # The job id alone repeats: every fresh local cluster numbers its first job 01000000.
        context = ray.get_runtime_context()
        return f"ray-{context.get_session_name()}-{context.get_job_id()}"
    own = os.environ.get(RUN_ID_ENV)
    if own and own != PROCESS.run_id_made:
        return own
    torchrun = os.environ.get("TORCHELASTIC_RUN_ID")
    if torchrun:
        return f"torchrun-{torchrun}" if torchrun != "none" else f"torchrun-agent{os.getppid()}"
    port = os.environ.get("MASTER_PORT")
    if port:
        # The id names a folder (save_path: .../{run}): no colon, which some
        # filesystems refuse, nor an IPv6 address's.
        rendezvous = safe_in_a_file_name(f"{os.environ.get('MASTER_ADDR', '')}-{port}")
        return f"ranks-{os.getppid()}-{rendezvous}"
    if own:
        return own
    # The id made up here (step 5) is exported for child processes, but a rendezvous set up
    # later in this process (step 4) still takes precedence: PROCESS remembers it is ours.
    made = PROCESS.run_id_made = f"run-{uuid.uuid4().hex[:12]}"
    os.environ[RUN_ID_ENV] = made
    return made


def safe_in_a_file_name(text: str) -> str:
    """``text`` with every character but letters, digits, ``.``, ``_`` and ``-`` made a ``-``."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in text)


class RunIdOnce:
    """The run id the records of one installation carry: resolved when the first is
    written, not at install (Ray's or torchrun's rendezvous, set up after install, still
    decides it), then the same for every observer.  Thread-safe; call it for the id."""

    def __init__(self, resolve: Callable[[], str] = run_id) -> None:
        self._resolve = resolve
        self._id: str | None = None
        self._lock = threading.Lock()

    def __call__(self) -> str:
        if self._id is None:
            with self._lock:
                if self._id is None:
                    self._id = self._resolve()
        return self._id
