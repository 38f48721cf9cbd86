"""The ``verl-events`` command line."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from verl_events import ConfigError, ObserverSetupError, VerlEventsWarning
from verl_events.config import load_config, read_config
from verl_events.layout import RUN_PLACEHOLDER

#: Where the demo writes unless told: a folder per run, outputs/demo/latest the newest.
DEMO_SAVE_PATH = "outputs/demo/{run}"


def _check(args: argparse.Namespace) -> int:
    """Validate a config and build its observers as install() would, without
    setting them up: nothing is written, no tool is started.  An observer
    whose tool is missing is an error, unless it is marked optional."""
    from verl_events.config import (
        REPLAYABLE,
        ArmedSelection,
        armed_stages,
        build_observers,
        nothing_to_observe,
        observer_origin,
    )

    try:
        config = load_config(args.config, args.overrides)
        specs = [spec for spec in config.observers if spec.enabled]
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", VerlEventsWarning)
            built = build_observers(config, set_up=False)  # exactly as install builds them, one per spec
    except (ConfigError, ObserverSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for warning in said:
        print(f"warning: {warning.message}", file=sys.stderr)
    save_path: Path | None = config.save_path
    if config.latest is not None:  # save_path: .../{run}: this check's own id names no real folder
        save_path = config.latest.resolve() if config.latest.is_symlink() else None
        shown = f"{config.latest.parent / RUN_PLACEHOLDER} (a folder per run; latest: {save_path or 'none yet'})"
    else:
        shown = str(config.save_path)
    print(f"save_path: {shown}  strict: {config.strict}")
    armed = armed_stages(built) if any(isinstance(o.selection, ArmedSelection) for o in built) else frozenset()
    if armed is None or armed:
        if config.replay is False:
            print("replay: off (replay: false); armed observers capture the steps after an anomaly only")
        else:
            replayed = ", ".join(sorted(REPLAYABLE if armed is None else REPLAYABLE & armed)) or "none of verl's"
            print(f"replay: after an anomaly, stages run again for the armed observers: {replayed}")
            print("  (and stages declared @emits_stage(..., replayable=True))")
    if not built:
        print(f"warning: {nothing_to_observe(args.config)}", file=sys.stderr)
    for spec, observer in zip(specs, built, strict=True):
        sel = observer.selection
        steps = _fmt(sel.steps)
        if isinstance(sel, ArmedSelection) and spec.trigger is not None:
            limit = spec.trigger.max_captures
            after = (
                f"{spec.trigger.capture_steps} after each anomaly "
                f"({f'at most {limit} time' + ('s' if limit > 1 else '') if limit else 'no limit'})"
            )
            steps = f"{_fmt(sel.fixed_steps)} and {after}" if sel.fixed_steps else after
        print(
            f"  {observer.name:<20} priority={observer.priority:<4} steps={steps} "
            f"stages={_fmt(sel.stages)} roles={_fmt(sel.roles)} ranks={_fmt(sel.ranks)}"
        )
        print(f"    from {observer_origin(spec)}")
        if spec.options:
            print("    options: " + ", ".join(f"{key}={value!r}" for key, value in spec.options.items()))
        described = observer.describe()
        if described:
            print(f"    {described}")
    for note in _save_path_notes(save_path) if save_path is not None else []:
        print(f"note: {note}")
    return 0


def _save_path_notes(save_path: Path) -> list[str]:
    """What a new run would meet in ``save_path``: another run's files, cut-off sessions."""
    from verl_events.layout import owner_of

    from .formats import msprobe_layout, timing_log

    notes = []
    dumps = msprobe_layout.session_dirs(save_path)
    logs = timing_log.timing_log_files(save_path)
    if dumps or logs:
        owner = owner_of(save_path)
        notes.append(
            f"save_path holds {len(dumps)} msprobe dump(s) and {len(logs)} timing log(s) of "
            f"{f'run {owner!r}' if owner else 'an earlier run'}; a new run there is refused, "
            "a process of that run may join it"
        )
    cut = msprobe_layout.incomplete_sessions(save_path)
    notes += [f"{path} is an incomplete msprobe session: {why}" for path, why in cut]
    return notes


def _demo(args: argparse.Namespace) -> int:
    """Run the miniature PPO loop (or, with --engine verl, verl's trainer) with the configured observers."""
    if args.engine == "verl":
        from .demo.verl_engine import command

        return command(args)
    steps = 6 if args.steps is None else args.steps
    for flag, value in (("--steps", steps), ("--nproc", args.nproc)):
        if value < 1:
            print(f"error: {flag} {value} is not allowed; use 1 or more", file=sys.stderr)
            return 2
    from .demo.options import DemoOptions, Injection, default_config, preflight

    try:
        from .demo.tiny import DemoRankError, run_demo
    except ImportError as exc:  # the demo trains a model: torch, from the demo extra
        if exc.name is None or exc.name.partition(".")[0] != "torch":
            raise
        print(
            f"error: the demo needs torch, which cannot be imported here ({exc}); "
            "install it with: pip install 'verl-events[demo,msprobe]'",
            file=sys.stderr,
        )
        return 2

    try:
        inject = Injection.parse(args.inject, steps) if args.inject is not None else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        raw = read_config(args.config) if args.config else None
        save_path = args.save_path or (raw or {}).get("save_path") or DEMO_SAVE_PATH

        config = dict(raw) if raw is not None else default_config(save_path)
        config["save_path"] = str(save_path)
        if args.nproc > 1:
            preflight(config)  # once here: a spawned rank would fail with a traceback
        else:
            load_config(config)
        seed = 0 if args.seed is None else args.seed
        run_demo(DemoOptions(config, steps, args.nproc, seed, perturb=args.perturb, inject=inject))
    except (ConfigError, ObserverSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DemoRankError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _compare(args: argparse.Namespace) -> int:
    """Find where two msprobe dumps first diverge."""
    import json

    from .compare import (
        STATS,
        CompareInputError,
        Pick,
        compare_dumps,
        print_comparison,
        resolve_dump,
        resolve_tolerances,
        summary,
        write_csv,
    )
    from .tables import terminal_console

    b_root = Path(args.b) if args.b else Path(args.a)
    if args.b is None and args.vs_step is None and args.vs_rank is None:
        print("error: give a second run B, or --vs-step / --vs-rank to compare within run A", file=sys.stderr)
        return 2
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
        print(f"error: {exc}", file=sys.stderr)
        return 2
    console = terminal_console(stderr=True, quiet=args.quiet or args.json)
    try:
        a, b = resolve_dump(Path(args.a), pick_a), resolve_dump(b_root, pick_b)
        with console.status(f"msprobe compare {a} vs {b}"):
            comparison = compare_dumps(a, b, tolerances)
    except CompareInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        write_csv(comparison, Path(args.csv))
    result = summary(comparison, args.top)
    if args.json:
        print(json.dumps(result, indent=1))
    elif not args.quiet:
        print_comparison(result, args.csv)
    return 1 if comparison.diverged else 0


def _triage(args: argparse.Namespace) -> int:
    """Name the op behind a run's first recorded anomaly."""
    import json

    from .tables import terminal_console
    from .triage import TriageInputError, render, triage

    try:
        result = triage(Path(args.run))
    except TriageInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for kind, lines in (("warning", result.warnings), ("note", result.notes)):
        for line in lines:
            print(f"{kind}: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.as_json(), indent=1))
    else:
        render(result, terminal_console(stderr=False))
    return 0 if result.anomaly is None else 1


def _fmt(values: frozenset[object] | None) -> str:
    return "all" if values is None else "[" + ",".join(map(str, sorted(values, key=str))) + "]"


def build_parser() -> argparse.ArgumentParser:
    # The file names in the help come from their formats' owners, which import no tool.
    from .formats import anomaly_record, msprobe_layout
    from .hangs import add_command as add_hangs_command
    from .mismatch.command import add_command as add_mismatch_command
    from .report import add_command as add_report_command

    DUMP_FILE, ANOMALY_LOG = msprobe_layout.DUMP_FILE, anomaly_record.ANOMALY_LOG

    parser = argparse.ArgumentParser(
        prog="verl-events",
        description="Check configs, run the CPU demo, and read runs back: report, compare, triage, hangs, mismatch.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate a config and list the observers it builds")
    check.add_argument("config", help="YAML config file")
    check.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. observers.0.steps=[1,2]")
    check.set_defaults(run_command=_check)

    demo = commands.add_parser("demo", help="run a miniature PPO loop on CPU with msprobe dumps and timing")
    demo.add_argument(
        "--engine",
        choices=("tiny", "verl"),
        default="tiny",
        help="tiny: the miniature loop (default); verl: verl's real trainer on CPU (needs verl-events[verl-cpu])",
    )
    demo.add_argument(
        "--config",
        help="observers YAML (default: msprobe L1 on steps 1-2 for actor/ref stages, timing always; "
        "verl engine: also torch.profiler on step 2's actor_update)",
    )
    demo.add_argument("--steps", type=int, help="training steps (default 6; verl engine 3)")
    demo.add_argument(
        "--save-path",
        help="output directory, {run} allowed (default: outputs/demo/{run}, a folder per run with "
        "outputs/demo/latest the newest; verl engine outputs/verl-demo/{run})",
    )
    demo.add_argument(
        "--nproc", type=int, default=1, help="processes joined with torch.distributed gloo (default 1; tiny engine)"
    )
    demo.add_argument("--seed", type=int, help="seed (default 0; tiny engine)")
    demo.add_argument(
        "--perturb",
        type=float,
        default=0.0,
        help="scale one actor weight (blocks.1.mlp.0) by 1+PERTURB, to try compare (tiny engine)",
    )
    demo.add_argument(
        "--inject",
        metavar="KIND@STEP",
        help="nan@STEP or spike@STEP: corrupt that actor weight at STEP's update on the last rank, "
        "to try the sentinel; nan-once@STEP or nan-flaky@STEP: a NaN in STEP's actor_compute_log_prob "
        "only, which its replay shows again (once) or not (flaky) (tiny engine; see docs/sentinel.md)",
    )
    demo.set_defaults(run_command=_demo)

    add_report_command(commands)

    cmp = commands.add_parser(
        "compare", help="find where two msprobe dumps first diverge (exit 0 match, 1 diverged, 2 bad input)"
    )
    cmp.add_argument("a", help=f"run dir, stage dir, rank dir or {DUMP_FILE}")
    cmp.add_argument("b", nargs="?", help="the other side (default: A again, with --vs-step/--vs-rank)")
    cmp.add_argument("--step", type=int, help="global step to pick in a run dir")
    cmp.add_argument("--stage", help="stage to pick in a run dir")
    cmp.add_argument("--rank", type=int, default=0, help="rank to pick (default 0)")
    cmp.add_argument(
        "--call", type=int, default=0, help="msprobe inner step, for a stage run more than once per step (default 0)"
    )
    cmp.add_argument("--vs-step", type=int, help="step for B (default: --step)")
    cmp.add_argument("--vs-rank", type=int, help="rank for B (default: --rank)")
    from .compare import DEFAULT_TOLERANCES  # stdlib only at import: the parser stays cheap

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
    cmp.set_defaults(run_command=_compare)

    tri = commands.add_parser(
        "triage",
        help=f"name the op behind a run's first anomaly, from {ANOMALY_LOG} and msprobe's dumps "
        "(exit 0 none, 1 anomaly, 2 bad input)",
    )
    tri.add_argument("run", help=f"the run's save_path (holding {ANOMALY_LOG} and msprobe's dumps)")
    tri.add_argument("--json", action="store_true", help="print the result as JSON")
    tri.set_defaults(run_command=_triage)
    add_hangs_command(commands)
    add_mismatch_command(commands)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("verl-events")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run_command(args))
    except KeyboardInterrupt:
        # The bus has already closed every open stage: sessions cut short are
        # marked incomplete on disk.  One line, no traceback.
        print("verl-events: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a full disk, a path that cannot be written: the environment, not a bug
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
