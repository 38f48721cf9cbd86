"""A rank that dies, on purpose: two gloo ranks, and rank 1 dies inside step 2's
``actor_update`` while rank 0 waits for it in an all-reduce (docs/postmortem.md).

    python examples/crash.py                    # exits 1: rank 1 is SIGKILLed
    python examples/crash.py segfault           # or: exception, sigterm
    verl-events diagnose outputs/crash/latest   # exits 1: which rank went first, where, and what followed

Each rank runs the watchdog (its liveness beat every 0.5 s here, 2 s by
default) and the timing observer.  Rank 1 dies the way you ask:

* ``sigkill``: ``kill -9``, as the kernel's OOM killer or a preemption
  does: the process writes nothing, its heartbeat stops;
* ``segfault``: a read of address 0 (faulthandler writes every thread's stack);
* ``exception``: a ``RuntimeError`` raised in the stage;
* ``sigterm``: SIGTERM, as a launcher stopping it sends.

Rank 0's all-reduce then fails ("Connection closed by peer"): the cascade.

Needs torch (``pip install 'verl-events[demo]'``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

import verl_events

CONFIG = {
    "save_path": "outputs/crash/{run}",
    "observers": [{"name": "watchdog", "heartbeat_s": 0.1, "liveness_s": 0.5}, {"name": "timing"}],
}
WAYS = ("sigkill", "segfault", "exception", "sigterm")


def die(way: str) -> None:
    time.sleep(1.0)  # a second into the stage: its heartbeat shows it open
    if way == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif way == "segfault":
        ctypes.string_at(0)
    elif way == "exception":
        raise RuntimeError("the rollout batch has 0 samples on this rank")
    else:
        os.kill(os.getpid(), signal.SIGTERM)


def rank_main(rank: int, port: str, way: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    with verl_events.install(CONFIG):
        for step in (1, 2, 3):
            with verl_events.stage("actor_update", step=step):
                if step == 2 and rank == 1:
                    die(way)
                dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


def main(way: str) -> int:
    if way not in WAYS:
        print(f"error: {way!r} is not a way to die here; use one of {', '.join(WAYS)}", file=sys.stderr)
        return 2
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    ranks = [
        subprocess.Popen([sys.executable, __file__, str(rank), port, way], stderr=subprocess.DEVNULL) for rank in (0, 1)
    ]
    codes = [rank.wait(timeout=120) for rank in ranks]
    print(f"rank 0 exited {codes[0]}, rank 1 exited {codes[1]}", file=sys.stderr)
    return 1 if any(codes) else 0


if __name__ == "__main__":
    if len(sys.argv) == 4:
        rank_main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
    else:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "sigkill"))
