"""The ``compare`` command: its arguments, what it prints and its exit codes
(0 no divergence, 1 diverged, 2 bad input)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from verl_events.observers.msprobe import layout as msprobe_layout

from .. import shell
from ..read.record import Evidence
from ..tables import terminal_console
from ..tools import Holding
from .comparison import Comparison, compare_dumps, summary, write_csv
from .pick import CompareInputError, Pick, resolve_dump
from .render import print_comparison
from .table import STATS
from .tolerance import DEFAULT_TOLERANCES, resolve_tolerances

__all__ = ["add_command", "command"]


def add_command(commands: Any) -> None:
    """Add ``compare`` to the ``verl-events`` parser's subcommands."""
    cmp = commands.add_parser(
        "compare", help="find where two msprobe dumps first diverge (exit 0 match, 1 diverged, 2 bad input)"
    )
    cmp.add_argument("a", help=f"run dir, stage dir, rank dir or {msprobe_layout.DUMP_FILE}")
    cmp.add_argument("b", nargs="?", help="the other side (default: A again, with --vs-step/--vs-rank)")
    cmp.add_argument("--step", type=int, help="global step to pick in a run dir")
    cmp.add_argument("--stage", help="stage to pick in a run dir")
    cmp.add_argument("--rank", type=int, default=0, help="rank to pick (default 0)")
    cmp.add_argument(
        "--call", type=int, default=0, help="msprobe inner step, for a stage run more than once per step (default 0)"
    )
    cmp.add_argument("--vs-step", type=int, help="step for B (default: --step)")
    cmp.add_argument("--vs-rank", type=int, help="rank for B (default: --rank)")
    for stat, default in DEFAULT_TOLERANCES.items():
        cmp.add_argument(
            f"--{stat}-rtol",
            type=float,
            help=f"relative tolerance of {stat}, a fraction of B's {stat} (default {default.rtol:g})",
        )
        cmp.add_argument(
            f"--{stat}-atol",
            type=float,
            help=f"absolute tolerance of {stat}, "
            f"a fraction of the tensor's largest |value| in B (default {default.atol:g})",
        )
    cmp.add_argument("--top", type=int, default=5, help="how many of the worst entries to list (default 5)")
    cmp.add_argument("--csv", help="write the full judged table to this CSV")
    cmp.add_argument("--json", action="store_true", help="print the summary as JSON")
    cmp.add_argument("--quiet", action="store_true", help="print nothing; use the exit code")
    cmp.set_defaults(run_command=command)


def command(args: argparse.Namespace) -> int:
    """Find where two msprobe dumps first diverge."""
    return shell.run(
        args,
        lambda: _compared(args),
        CompareInputError,
        text=lambda comparison: None if args.quiet else print_comparison(summary(comparison, args.top), args.csv),
        as_json=lambda comparison: summary(comparison, args.top),
        exit_code=lambda comparison: 1 if comparison.diverged else 0,
    )


def _compared(args: argparse.Namespace) -> Comparison:
    """The two dumps the arguments pick, compared (and ``--csv`` written); CompareInputError
    for arguments that pick none, a bad tolerance or a dump that cannot be read."""
    if args.b is None and args.vs_step is None and args.vs_rank is None:
        raise CompareInputError("give a second run B, or --vs-step / --vs-rank to compare within run A")
    pick_a = Pick(step=args.step, stage=args.stage, rank=args.rank, call=args.call)
    pick_b = Pick(
        step=args.vs_step if args.vs_step is not None else args.step,
        stage=args.stage,
        rank=args.vs_rank if args.vs_rank is not None else args.rank,
        call=args.call,
    )
    try:
        tolerances = resolve_tolerances(
            {stat: getattr(args, f"{stat}_rtol") for stat in STATS},
            {stat: getattr(args, f"{stat}_atol") for stat in STATS},
        )
    except ValueError as exc:
        raise CompareInputError(str(exc)) from exc
    console = terminal_console(stderr=True, quiet=args.quiet or args.json)
    a, b = resolve_dump(Path(args.a), pick_a), resolve_dump(Path(args.b) if args.b else Path(args.a), pick_b)
    with console.status(f"msprobe compare {a} vs {b}"):
        comparison = compare_dumps(a, b, tolerances)
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        write_csv(comparison, Path(args.csv))
    return comparison


def headline(evidence: Evidence, holding: Holding) -> str:
    """msprobe's line in ``verl-events diagnose``: its dumps, and those cut off mid-stage;
    with one dump alone, that a comparison needs another run's."""
    cut = msprobe_layout.incomplete_sessions(evidence.run)
    alone = "; one dump: compare it with another run's (verl-events compare --help)" if not _pair(evidence) else ""
    return f"{holding.describe()}{f', {len(cut)} incomplete (cut off mid-stage)' if cut else ''}{alone}"


def suggestion(evidence: Evidence, holding: Holding) -> str | None:
    """The comparison to run within this run, as diagnose prints it: a stage's first two dumped
    steps, else its first two ranks; None when the run holds one dump alone."""
    pair = _pair(evidence)
    return None if pair is None else f"verl-events compare {evidence.run} {pair}"


def _pair(evidence: Evidence) -> str | None:
    places = [p for p in msprobe_layout.session_places(evidence.run) if p.call == 0]
    for place in places:
        steps = sorted({p.step for p in places if p.stage == place.stage and p.rank == place.rank})
        if len(steps) > 1:
            return f"--stage {place.stage} --rank {place.rank} --step {steps[0]} --vs-step {steps[1]}"
    for place in places:
        ranks = sorted({p.rank for p in places if p.stage == place.stage and p.step == place.step})
        if len(ranks) > 1:
            return f"--stage {place.stage} --step {place.step} --rank {ranks[0]} --vs-rank {ranks[1]}"
    return None
