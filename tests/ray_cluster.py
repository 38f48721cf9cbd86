"""A Ray cluster of several nodes on this machine, started beforehand as a multi-node user starts
one (../shared/reference/verl-cpu-notes.md, "Several ranks and nodes on this machine").

Each node is ``ray start --block`` in a session of its own, with its own temp dir and ports, token
authentication off (``RAY_AUTH_MODE=disabled``: Ray 2.60's head turns it on and a second node is
then refused) and no pre-started workers.  A node's processes (GCS, raylet, agents, workers) stay
in its session.  Stopping a node sends SIGTERM to its ``ray start``, which drains the node (the GCS
lists it dead at once) and ends its processes; then whatever is left of its session is killed by
PID.  ``ray stop`` is never called: it ends every Ray process of the machine, other clusters' too.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from verl_events.apps.verl_cpu.session import reap_session, session_members

__all__ = ["LocalRayCluster", "RAY_ENV"]

#: What every node and every driver of the cluster needs in its environment.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_enable_worker_prestart": "0", "RAY_USAGE_STATS_ENABLED": "0"}
_STARTED = "Ray runtime started."
_WORKER_PORTS = 100


@dataclass
class _Node:
    process: subprocess.Popen[bytes]
    log: Path

    def running(self) -> bool:
        return self.process.poll() is None


class LocalRayCluster:
    """``nodes`` Ray nodes on this machine, each with ``num_cpus`` (logical) CPUs and ``num_gpus``
    fake GPUs; :attr:`address` is the head's ``HOST:PORT``.  ``token``: token authentication on,
    as ``ray start`` has it by default (its token in a file under the cluster's temp dir, named
    by ``RAY_AUTH_TOKEN_PATH`` in :attr:`env`, which a driver needs with ``RAY_AUTH_MODE=token``).
    A context manager: every node is stopped at exit, and the temp dirs removed."""

    def __init__(
        self, nodes: int, env: Mapping[str, str], *, num_cpus: int = 6, num_gpus: int = 1, token: bool = False
    ) -> None:
        self.env = {**env, **RAY_ENV}
        self.root = Path(tempfile.mkdtemp(prefix="ve-ray-"))  # short: Ray's socket paths live under it
        if token:  # Ray's default for ray start: token authentication, the token in a file of its own here
            (self.root / "auth_token").write_text(secrets.token_hex(32))
            self.env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.root / "auth_token")}
        self.count, self.num_cpus, self.num_gpus = nodes, num_cpus, num_gpus
        self.nodes: list[_Node] = []
        self.address = f"127.0.0.1:{_free_port()}"

    def __enter__(self) -> LocalRayCluster:
        try:
            for index in range(self.count):
                self.nodes.append(self._start(index))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _start(self, index: int, timeout: float = 120.0) -> _Node:
        ports = [_free_port() for _ in range(6)]
        low = _free_range(_WORKER_PORTS)
        args = [
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={self.root / f'node{index}'}",
            f"--num-cpus={self.num_cpus}",
            f"--num-gpus={self.num_gpus}",
            f"--node-manager-port={ports[0]}",
            f"--object-manager-port={ports[1]}",
            f"--dashboard-agent-listen-port={ports[2]}",
            f"--dashboard-agent-grpc-port={ports[3]}",
            f"--metrics-export-port={ports[4]}",
            f"--runtime-env-agent-port={ports[5]}",
            f"--min-worker-port={low}",
            f"--max-worker-port={low + _WORKER_PORTS - 1}",
            "--object-store-memory=200000000",
            "--disable-usage-stats",
            "--block",
        ]
        if index == 0:
            port = self.address.rpartition(":")[2]
            args = ["--head", f"--port={port}", "--include-dashboard=false", *_head_ports(), *args]
        else:
            args = [f"--address={self.address}", *args]
        log = self.root / f"node{index}.log"
        ray = Path(sys.executable).with_name("ray")
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(ray), "start", *args], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        node = _Node(process, log)
        deadline = time.monotonic() + timeout
        while _STARTED not in log.read_text(errors="replace"):
            if not node.running() or time.monotonic() > deadline:
                self.nodes.append(node)  # stopped by close()
                raise RuntimeError(f"ray start of node {index} failed:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.3)
        return node

    def stop_node(self, index: int, timeout: float = 60.0) -> None:
        """Stop node ``index`` as a node goes down: SIGTERM to its ``ray start``, then every
        process left in its session killed by PID."""
        node = self.nodes[index]
        with contextlib.suppress(ProcessLookupError):
            node.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout)
        reap_session(node.process.pid, timeout=20.0)
        node.process.wait()

    def close(self) -> None:
        for index in reversed(range(len(self.nodes))):  # the head last
            if self.nodes[index].running() or session_members(self.nodes[index].process.pid):
                self.stop_node(index)
        shutil.rmtree(self.root, ignore_errors=True)


def _head_ports() -> list[str]:
    return [f"--ray-client-server-port={_free_port()}", f"--dashboard-port={_free_port()}"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_range(count: int) -> int:
    """The first of ``count`` consecutive ports that are free now, outside the ephemeral range."""
    for _ in range(50):
        low = random.randrange(20_000, 30_000 - count)
        try:
            with contextlib.ExitStack() as stack:
                for port in range(low, low + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return low
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports between 20000 and 30000")
