"""Every node of a Ray cluster, asked through Ray itself: one task pinned to each node.

:func:`ask_every_node` connects to the cluster as a driver of its own (a job beside
the training job, which it does not disturb), runs
:func:`~.node.read_node_folder` in one task per alive node, pinned there
(``NodeAffinitySchedulingStrategy(node, soft=False)``: never moved to another node)
and asking for no CPU (it runs beside a training job that holds them all), then
hands each node's answer over in node order, one at a time, so that only one
node's files are held at once.  A node is **unreachable** when Ray lists it dead,
when its task fails (the node died meanwhile, verl_events cannot be imported there,
...), or when its task has not answered within ``timeout`` seconds (then it is
cancelled).  This is the only module of verl_events that imports Ray: the run's
processes never load it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .folder import GatherInputError
from .node import NodeFolder, read_node_folder

__all__ = ["NodeAnswer", "ask_every_node"]


@dataclass(frozen=True, slots=True)
class NodeAnswer:
    """One node of the cluster: its id, address and host as Ray lists them, and what
    its task found (``folder``), or why it could not be reached (``why``)."""

    node: str
    address: str
    host: str
    folder: NodeFolder | None = None
    why: str | None = None


def ask_every_node(
    address: str,
    template: str,
    *,
    everything: bool,
    max_bytes: int,
    timeout: float,
    on_answer: Callable[[NodeAnswer], None],
) -> None:
    """Call ``on_answer`` once for every node Ray knows, alive or dead, in the order of
    their addresses and ids.  GatherInputError when the cluster cannot be reached or
    Ray is not installed."""
    try:  # untyped for mypy: Ray's stubs describe remote functions by their arity, not ours
        ray: Any = importlib.import_module("ray")
        pinned: Any = importlib.import_module("ray.util.scheduling_strategies").NodeAffinitySchedulingStrategy
    except ImportError as exc:
        raise GatherInputError(
            f"gather reaches the nodes through Ray, which is not installed here ({exc}); install the "
            "cluster's version of ray (it comes with verl)"
        ) from None
    _check_listening(address, timeout)
    why: str | None = None
    with _output_aside() as said:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as exc:  # Ray raises ConnectionError, ValueError, RuntimeError ... for a bad address
            why = _why_not_connected(address, exc, said())
    if why is not None:
        raise GatherInputError(why)
    try:
        nodes = sorted(ray.nodes(), key=lambda n: (str(n.get("NodeManagerAddress")), str(n.get("NodeID"))))
        task = ray.remote(num_cpus=0, max_retries=0)(read_node_folder)
        asked = {
            node["NodeID"]: task.options(scheduling_strategy=pinned(node["NodeID"], soft=False)).remote(
                template, everything, max_bytes
            )
            for node in nodes
            if node.get("Alive")
        }
        ready, _ = (
            ray.wait(list(asked.values()), num_returns=len(asked), timeout=timeout, fetch_local=False)
            if asked
            else ([], [])
        )
        answered = set(ready)
        for node in nodes:
            on_answer(_answer(ray, node, asked.get(node["NodeID"]), answered, timeout))
    finally:
        ray.shutdown()


#: What Ray's client logs when the cluster refuses its token (token authentication, on by
#: default for ``ray start`` since Ray 2.5x).
_AUTH_REFUSED = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError")


@contextlib.contextmanager
def _output_aside() -> Iterator[Callable[[], str]]:
    """Ray's own output while it connects (its C++ client logs every retry, twenty lines over
    twenty seconds) into a file aside, not the console; what it said, for the error."""
    with tempfile.TemporaryFile() as aside:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(aside.fileno(), 2)
        try:
            yield lambda: _read_back(aside)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _read_back(aside: Any) -> str:
    aside.seek(0)
    return str(aside.read(1 << 20).decode("utf-8", errors="replace"))


def _why_not_connected(address: str, exc: Exception, said: str) -> str:
    """The error of a failed connection: authentication named when Ray's client said so."""
    if any(word in f"{said} {exc}" for word in _AUTH_REFUSED):
        return (
            f"--ray {address}: the cluster refused gather's authentication token (Ray's token authentication, "
            "InvalidAuthToken). Run gather with the environment of a driver of that cluster: RAY_AUTH_MODE=token "
            "and its token (in RAY_AUTH_TOKEN, or in the file RAY_AUTH_TOKEN_PATH names; ray start writes "
            "~/.ray/auth_token; Ray's docs: ray-security/token-auth)"
        )
    last = [line for line in said.splitlines() if line.strip()][-1:]
    return f"--ray {address}: cannot connect to a Ray cluster there ({exc})" + (
        f"; Ray's last word: {last[0][-300:]}" if last else ""
    )


def _check_listening(address: str, timeout: float) -> None:
    """GatherInputError when nothing listens at ``address`` (HOST:PORT): Ray itself would
    try again for minutes.  ``auto`` (Ray finds the cluster) is left to Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout, 10.0)).close()
    except OSError as exc:
        raise GatherInputError(
            f"--ray {address}: no Ray cluster answers there ({exc.strerror or exc}); give the head node's "
            "HOST:PORT (the address the job connected to; ray start --head prints it)"
        ) from None


def _answer(ray: Any, node: dict[str, Any], ref: Any, answered: set[Any], timeout: float) -> NodeAnswer:
    known = NodeAnswer(
        str(node["NodeID"]), str(node.get("NodeManagerAddress", "?")), str(node.get("NodeManagerHostname", "?"))
    )
    if ref is None:
        reason = node.get("DeathReasonMessage")
        return _unreachable(known, "Ray lists the node as dead" + (f" ({reason})" if reason else ""))
    if ref not in answered:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
        return _unreachable(known, f"its task did not answer within {timeout:g} s")
    try:
        folder = ray.get(ref)
    except Exception as exc:  # the task's own error, or Ray's when the node died meanwhile
        lines = str(exc).strip().splitlines()
        return _unreachable(known, f"its task failed: {type(exc).__name__}: {lines[-1] if lines else exc}")
    return NodeAnswer(known.node, known.address, known.host, folder=folder)


def _unreachable(node: NodeAnswer, why: str) -> NodeAnswer:
    return NodeAnswer(node.node, node.address, node.host, why=why)
