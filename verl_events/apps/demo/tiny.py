"""``verl-events demo``: a miniature PPO loop on CPU, observed end to end (the tiny engine).

Each step calls verl's stages in verl's order on the small torch models and
verl-shaped workers of :mod:`.model`, with the observers of the run's config
(:mod:`.options`) installed.  With ``--nproc N`` the loop runs in N
processes joined by torch.distributed (gloo) that all-reduce gradients.

Imported only by the CLI: the core package never imports torch.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import verl_events
from verl_events import STAGE_ROLES

from .model import (
    BATCH,
    PROMPT_LEN,
    VOCAB,
    ActorRolloutRefWorker,
    Batch,
    CriticWorker,
    TinyCausalLM,
    compute_advantages,
)
from .options import INJECTED_WEIGHT, DemoOptions
from .summary import has_msprobe, observer_names, print_summary

STAGE_ORDER = tuple(STAGE_ROLES)  # the order verl runs its stages in

#: The stages the demo runs each step, in verl's order: its compute stages (no reward model,
#: no engine workers, no rollout server to prefill; no weight sync or checkpoint either).
DEMO_STAGES = (
    "rollout_generate",
    "ref_compute_log_prob",
    "actor_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
)


def run_rank(rank: int, options: DemoOptions, progress: Callable[[int, str], None] | None = None) -> None:
    """One process of the demo: build the models, install the observers, train."""
    if options.nproc > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(options.port))
        dist.init_process_group("gloo", rank=rank, world_size=options.nproc)
        torch.set_num_threads(1)
    torch.manual_seed(options.seed)  # same initial weights on every rank
    actor = TinyCausalLM()
    ref = copy.deepcopy(actor).requires_grad_(False)
    if options.perturb:
        # One actor weight off by a relative `perturb`, to try `verl-events compare`:
        # the first divergence is the first op that reads it.
        with torch.no_grad():
            actor.get_parameter(INJECTED_WEIGHT).mul_(1 + options.perturb)
    critic = TinyCausalLM(out_dim=1)
    actor_worker, critic_worker = ActorRolloutRefWorker(actor, ref), CriticWorker(critic)
    data_rng = torch.Generator().manual_seed(options.seed * 1000 + rank)
    try:
        config = options.config
        if options.inject is not None:
            config = {
                **config,
                "observers": [*config.get("observers", []), options.inject.observer_entry(options.nproc)],
            }
        with verl_events.install(config):
            for step in range(1, options.steps + 1):
                prompts = torch.randint(0, VOCAB, (BATCH, PROMPT_LEN), generator=data_rng)
                torch.manual_seed(options.seed * 100_000 + rank * 1000 + step)  # sampling
                batch = Batch({"prompts": prompts}, {"global_steps": step})
                calls: dict[str, Callable[[Batch], Any]] = {
                    "rollout_generate": actor_worker.generate_sequences,
                    "ref_compute_log_prob": actor_worker.compute_ref_log_prob,
                    "actor_compute_log_prob": actor_worker.compute_log_prob,
                    "compute_values": critic_worker.compute_values,
                    "critic_update": critic_worker.update_critic,
                    "actor_update": actor_worker.update_actor,
                }
                for name in DEMO_STAGES:
                    if progress is not None:
                        progress(step, name)
                    result = calls[name](batch)
                    if isinstance(result, Batch):
                        batch = result
                    if name == "compute_values":
                        compute_advantages(batch)
    finally:
        if dist.is_initialized():
            # Tear gloo down only once every rank is done with it: a rank that
            # exits while its peer is still tearing down can abort the peer.
            dist.barrier()
            dist.destroy_process_group()


def _spawned(rank: int, options: DemoOptions) -> None:
    def progress(step: int, stage: str) -> None:  # rank 0 speaks for all; a bar cannot span processes
        if stage == DEMO_STAGES[0]:
            print(f"demo: step {step}/{options.steps} on {options.nproc} ranks", file=sys.stderr, flush=True)

    run_rank(rank, options, progress if rank == 0 else None)
    # Everything is written and closed by now.  Leave without the interpreter's
    # teardown: gloo's C++ threads have been seen to abort a finished rank
    # while static objects are destroyed ("terminate called without an active
    # exception"), which would fail a run whose work is done.
    import multiprocessing.util

    multiprocessing.util._exit_function()  # type: ignore[attr-defined]  # what a normal exit runs: release queues and semaphores
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


#: How many ports the ranks try to meet on before the demo gives up.
PORT_ATTEMPTS = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DemoRankError(RuntimeError):
    """A spawned demo rank raised; the message is its error's last line."""


def run_demo(options: DemoOptions) -> Path:
    """Run all ranks, show progress, print the overhead table; return save_path."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from verl_events.config import load_config
    from verl_events.layout import run_id

    from ..tables import terminal_console

    console = terminal_console(stderr=True)
    save_path = load_config(options.config).save_path  # {run} filled in as every rank fills it
    started = time.perf_counter()
    if options.nproc > 1:
        import torch.multiprocessing as mp

        console.print(f"demo: {options.steps} steps on {options.nproc} processes (gloo) ...")
        run_id()  # made up here and inherited, so that the ranks agree on their run
        for attempt in range(1, PORT_ATTEMPTS + 1):
            with_port = dataclasses.replace(options, port=_free_port())
            try:
                mp.spawn(_spawned, args=(with_port,), nprocs=options.nproc)  # type: ignore[attr-defined]
                break
            except mp.ProcessRaisedException as exc:  # type: ignore[attr-defined]
                # The port was free when chosen, but another process may take it before rank 0
                # listens on it; then no rank got past joining, nothing is written: try another.
                if "EADDRINUSE" in str(exc) and attempt < PORT_ATTEMPTS:
                    console.print(f"demo: port {with_port.port} was taken meanwhile; trying another")
                    continue
                # Its message is the rank's whole traceback; its last line says what happened.
                raise DemoRankError(f"a demo rank failed: {str(exc).strip().splitlines()[-1]}") from exc
    else:
        columns = (
            TextColumn("[bold]step {task.fields[step]}[/] {task.fields[stage]:<24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("demo", total=options.steps * len(DEMO_STAGES), step=1, stage="")

            def progress(step: int, stage: str) -> None:
                bar.update(task, advance=0 if (step, stage) == (1, DEMO_STAGES[0]) else 1, step=step, stage=stage)

            run_rank(0, options, progress)
            bar.update(task, completed=options.steps * len(DEMO_STAGES), stage="done")
    seconds = time.perf_counter() - started
    print_summary(
        save_path,
        seconds,
        console,
        stages=STAGE_ORDER,
        msprobe_configured=has_msprobe(options.config),
        observers=observer_names(options.config),
    )
    return save_path
