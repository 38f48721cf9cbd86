"""A hang, on purpose: two gloo ranks, and rank 1 stops inside ``actor_update``
before the all-reduce that rank 0 is already waiting in (docs/hangs.md).

    python examples/hang.py                  # 5 to 25 s (the first run imports torch cold); exits 124, as both ranks do
    verl-events hangs outputs/hang/latest    # exits 1: which rank is where

Each rank runs the watchdog with a 3 s deadline and ``action: abort``: once
its report is written, the rank ends with exit code 124, as a launcher would
see it.  Rank 1 reaches the stage a second after rank 0, so rank 0's
deadline passes first (had rank 1 gone first, rank 0's all-reduce would have
failed at once: gloo sees the peer close its connection).

Needs torch (``pip install 'verl-events[demo]'``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import verl_events

CONFIG = {
    "save_path": "outputs/hang/{run}",
    "observers": [{"name": "watchdog", "timeout_s": 3, "action": "abort"}],
}


def rank_main(rank: int, port: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    with verl_events.install(CONFIG):
        with verl_events.stage("actor_compute_log_prob", step=1):
            pass
        if rank == 1:
            time.sleep(1)
        with verl_events.stage("actor_update", step=1):
            if rank == 1:
                time.sleep(600)  # the stuck line
            dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    ranks = [subprocess.Popen([sys.executable, __file__, str(rank), port]) for rank in (0, 1)]
    codes = [rank.wait(timeout=120) for rank in ranks]
    print(f"rank 0 exited {codes[0]}, rank 1 exited {codes[1]}", file=sys.stderr)
    return max(codes)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        rank_main(int(sys.argv[1]), sys.argv[2])
    else:
        sys.exit(main())
