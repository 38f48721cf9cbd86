"""``verl-events mismatch RUN``: from "old_log_prob and rollout_log_prob disagree" to the tokens and the layer.

Without ``--layers``: each step's ``|Δ log p|`` (the mismatch observer's
``mismatch.jsonl``, :mod:`.summary`), the trend over steps, ``|Δ log p|`` by
response position and by entropy, and the worst tokens (decoded with
``--tokenizer``).  With ``--layers STEP``: that step's layer profile
(:mod:`.layers`).  ``--plot FILE.png`` draws the quantiles over steps and
``|Δ log p|`` by position, or with ``--layers`` each layer's relative error
(matplotlib) and names the file it wrote (``plot: FILE``, on stderr with ``--json``).
``--json`` prints the result as JSON instead.

Exit codes: 0 shown, 2 bad input (no records, no ``rollout_log_probs``, a
step without both dumps, a tokenizer that does not load, a plot that cannot
be written).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from verl_events.observers.mismatch import record as mismatch_record
from verl_events.observers.mismatch.record import MismatchRecord

from .. import shell
from ..read.jsonl import numbered_lines
from ..read.record import Evidence
from ..tools import Holding
from .layers import DEFAULT_TOLERANCE, LayerProfile, layer_profile
from .scale import scale_line
from .summary import MismatchInputError, Summary, summarize

__all__ = ["add_command", "command"]


#: The command's line in ``verl-events --help``; the other, what RUN is.
HELP = (
    "how far the trainer's log-probs are from the rollout engine's, by step, token and layer "
    "(exit 0 shown, 2 bad input)"
)
RUN_HELP = f"the run's save_path (holding {mismatch_record.MISMATCH_LOG})"


def add_command(commands: Any) -> None:
    """Add ``mismatch`` to the ``verl-events`` parser's subcommands."""
    parser = shell.add_run_command(commands, "mismatch", command, help=HELP, run=RUN_HELP)
    parser.add_argument(
        "--top", type=int, help="worst tokens to list (default 10; at most the observer's top_k per step and rank)"
    )
    parser.add_argument("--tokenizer", help="a tokenizer folder or name (transformers), to decode the worst tokens")
    parser.add_argument(
        "--layers", type=int, metavar="STEP", help="the layer profile of STEP: engine prefill vs trainer"
    )
    parser.add_argument("--rank", type=int, help="--layers: the rank whose dumps it compares (default 0)")
    parser.add_argument(
        "--tolerance",
        type=float,
        help=f"--layers: the relative error a layer may reach (default {DEFAULT_TOLERANCE:g})",
    )
    parser.add_argument(
        "--modules",
        action="store_true",
        help="--layers: list every module, not only the layers and the modules inside the ones marked",
    )
    parser.add_argument(
        "--plot", metavar="FILE", help="draw the result into FILE (.png, .svg or .pdf) and say so: 'plot: FILE'"
    )


def command(args: Any) -> int:
    """``verl-events mismatch RUN [...]``; the exit code (see the module docstring)."""
    return shell.run(
        args,
        lambda: _read(args),
        MismatchInputError,
        text=lambda read: render_layers(read, every=args.modules) if isinstance(read, LayerProfile) else render(read),
        as_json=lambda read: json_safe(read.as_json()),
        warnings=lambda read: read.warnings if isinstance(read, Summary) else [],
        after=lambda read: _said_plot(args),
    )


def _read(args: Any) -> LayerProfile | Summary:
    """``--layers STEP``'s profile, else the summary over the steps (its tokens decoded with
    ``--tokenizer``); ``--plot`` drawn from it."""
    from . import plot

    _check_arguments(args)
    if args.layers is not None:
        rank = 0 if args.rank is None else args.rank
        tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
        profile = layer_profile(Path(args.run), args.layers, rank, tolerance)
        if args.plot:
            plot.plot_layers(profile, Path(args.plot))
        return profile
    summary = summarize(Path(args.run), top=10 if args.top is None else args.top)
    if args.tokenizer:
        decode(summary, args.tokenizer)
    if args.plot:
        plot.plot_summary(summary, Path(args.plot))
    return summary


def _said_plot(args: Any) -> None:
    if args.plot:
        # After the result, so it is the last line a reader sees; with --json, stdout stays JSON.
        print(f"plot: {args.plot}", file=sys.stderr if args.json else sys.stdout)


def json_safe(value: Any) -> Any:
    """``value`` with every NaN and infinity as null: JSON has no such numbers, and ``jq``
    and most parsers refuse Python's ``NaN``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def _check_arguments(args: Any) -> None:
    if args.top is not None and args.top < 0:
        raise MismatchInputError(f"--top {args.top}: use a number of tokens >= 0")
    if args.rank is not None and args.rank < 0:
        raise MismatchInputError(f"--rank {args.rank}: use a rank >= 0")
    if args.tolerance is not None and not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise MismatchInputError(f"--tolerance {args.tolerance}: use a relative error > 0, such as 1e-3")
    if args.layers is not None and args.layers < 0:
        raise MismatchInputError(f"--layers {args.layers}: use a step number >= 0")
    if args.layers is None:
        given = [flag for flag, value in (("--rank", args.rank), ("--tolerance", args.tolerance)) if value is not None]
        if args.modules:
            given.append("--modules")
        if given:
            raise MismatchInputError(f"{given[0]} applies to --layers STEP's profile; add --layers STEP")
    else:
        given = [flag for flag, value in (("--tokenizer", args.tokenizer), ("--top", args.top)) if value is not None]
        if given:
            raise MismatchInputError(f"{given[0]} is for the worst tokens, which --layers does not list; drop one")
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise MismatchInputError(f"--plot {args.plot}: name a .png, .svg or .pdf file")


def decode(summary: Summary, tokenizer_path: str) -> None:
    """Add each worst token's text (``text``), decoded by the tokenizer at ``tokenizer_path``."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    except Exception as exc:
        raise MismatchInputError(
            f"--tokenizer {tokenizer_path}: no tokenizer loads from there ({type(exc).__name__}: {exc}); give the "
            "model's folder, as in actor_rollout_ref.model.path"
        ) from None
    for token in summary.worst:
        if token.get("token") is not None:
            token["text"] = tokenizer.decode([token["token"]])


# -- text ------------------------------------------------------------------


def _g(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}"


def render(summary: Summary) -> str:
    lines = [f"mismatch: {summary.run}"]
    ranks = sorted({row["rank"] for row in summary.steps})
    tokens = sum(row["tokens"] for row in summary.steps)
    lines.append(
        f"{len(summary.trend)} step(s), {len(ranks)} rank(s), {tokens} response tokens: the trainer's "
        "old_log_probs against the rollout's rollout_log_probs"
    )
    lines.append("")
    lines.append(_table(summary))
    lines.extend(["", _trend_line(summary)])
    if (scale := scale_line(summary.trend)) is not None:
        lines.append(scale)
    if behind := _behind_steps(summary):
        lines.append(
            f"older weights: at step(s) {', '.join(map(str, behind))} the rollout sampled with weights older than the "
            "trainer's (verl's asynchronous modes), so |Δ log p| there holds the policy's change between the versions, "
            "not only the engines' disagreement"
        )
    for title, rows, key in (
        ("|Δ log p| by response position", summary.by_position, "position"),
        ("|Δ log p| by the trainer's entropy (nats)", summary.by_entropy, "entropy"),
    ):
        if rows:
            lines.extend(["", title + ":", _bins(rows, key)])
    if summary.worst:
        lines.extend(["", "worst tokens:", _worst(summary)])
    for missing in summary.missing:
        lines.append(f"not compared: step {missing['step']} rank {missing['rank']}: {missing['why']}")
    return "\n".join(lines)


def _columns(header: list[str], rows: list[list[str]], left: tuple[int, ...] = ()) -> str:
    """The rows under the header, each column as wide as its widest cell: the columns
    numbered in ``left`` flush left, the others flush right; no line ends in spaces."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if place in left else cell.rjust(width)
            for place, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    )


def _versions_behind(weights: dict[str, int] | None) -> tuple[int, int] | None:
    """How many weight versions the rollout's side is behind the trainer's: (least, most)."""
    if weights is None:
        return None
    return weights["trainer"] - weights["rollout_max"], weights["trainer"] - weights["rollout_min"]


def _behind_steps(summary: Summary) -> list[Any]:
    """The steps where some rank compared a rollout sampled with older weights."""
    return sorted(
        {row["step"] for row in summary.steps if (behind := _versions_behind(row.get("weights"))) and behind[1] > 0},
        key=lambda step: (step is None, step or 0),
    )


def _weights_cell(weights: dict[str, int] | None) -> str:
    behind = _versions_behind(weights)
    if behind is None:
        return "-"
    least, most = behind
    if most == 0:
        return "same"
    return f"{least} behind" if least == most else f"{least}-{most} behind"


def _table(summary: Summary) -> str:
    header = ["step", "rank", "tokens", "mean", "p50", "p90", "p99", "max", "|Δp| max", "verl diff mean", "pearson"]
    tagged = any(row.get("weights") is not None for row in summary.steps)
    if tagged:
        header.append("rollout weights")
    rows = []
    for row in summary.steps:
        gap, prob, verl = row.get("log_prob", {}), row.get("prob", {}), row["verl"]
        rows.append(
            [
                str(row["step"]),
                str(row["rank"]),
                str(row["tokens"]) + (f" ({row['nonfinite']} non-finite)" if row.get("nonfinite") else ""),
                *(_g(gap.get(key)) for key in ("mean", "p50", "p90", "p99", "max")),
                _g(prob.get("max")),
                _g(verl.get("probs_diff_mean")),
                "-" if verl.get("pearson_corr") is None else f"{verl['pearson_corr']:.6f}",
                *([_weights_cell(row.get("weights"))] if tagged else []),
            ]
        )
    return "|Δ log p| per step and rank; verl's training/rollout_probs_diff_mean and pearson_corr:\n" + _columns(
        header, rows
    )


def _trend_line(summary: Summary) -> str:
    trend = summary.trend
    if not trend:
        nonfinite = sum(row.get("nonfinite", 0) for row in summary.steps)
        return f"trend: no step had a finite response token to compare ({nonfinite} non-finite)"
    first, last = trend[0], trend[-1]
    worst = max(trend, key=lambda t: t["max"])
    ratio = f" (x{last['mean'] / first['mean']:.3g})" if first["mean"] > 0 else ""
    return (
        f"trend: mean |Δ log p| {_g(first['mean'])} at step {first['step']} -> {_g(last['mean'])} at step "
        f"{last['step']}{ratio}; the largest, {_g(worst['max'])}, at step {worst['step']}"
    )


def _bins(rows: list[dict[str, Any]], key: str) -> str:
    if key == "position":
        places = [
            f"{row['start']}-{row['end'] - 1}" if row["end"] - row["start"] > 1 else str(row["start"]) for row in rows
        ]
    else:
        places = [
            f"{row['low']:g}-{row['high']:g}" if row["high"] is not None else f">= {row['low']:g}" for row in rows
        ]
    # Empty bins stay in --json; here they would only push the filled ones apart.
    body = [
        [place, str(row["tokens"]), _g(row["mean"]), _g(row["max"])]
        for place, row in zip(places, rows, strict=True)
        if row["tokens"]
    ]
    return _columns([key, "tokens", "mean", "max"], body)


def _worst(summary: Summary) -> str:
    header = ["step", "rank", "sample", "position", "token", "old", "rollout", "Δ", "entropy"]
    rows = []
    for token in summary.worst:
        shown = "-" if token.get("token") is None else str(token["token"])
        if "text" in token:
            shown += f" {token['text']!r}"
        rows.append(
            [
                str(token["step"]),
                str(token["rank"]),
                str(token["sample"]),
                str(token["position"]),
                shown,
                f"{token['old']:.4f}",
                f"{token['rollout']:.4f}",
                f"{token['delta']:+.3g}",
                _g(token.get("entropy")),
            ]
        )
    return _columns(header, rows)


def render_layers(profile: LayerProfile, *, every: bool = False) -> str:
    """The profile as text: the layers, with the modules inside the marked ones (``every``: all)."""
    lines = [
        f"layer profile, step {profile.step}, rank {profile.rank}: the rollout engine's prefill against the trainer's "
        "forward, relative error ||engine - trainer|| / ||trainer|| of each module's output",
        f"  trainer: {profile.trainer}",
        f"  engine:  {profile.engine}",
        "",
    ]
    first, grows = profile.first_past, profile.grows_most
    header = ["module", "calls", "rel. error", "growth", ""]
    rows = []
    marked = [m.module + "." for m in (first, grows) if m is not None]
    for module in profile.modules:
        if not (every or module.layer or module.module.startswith(tuple(marked))):
            continue
        marks = []
        if module is first:
            marks.append(f"<- first past {profile.tolerance:g}")
        if module is grows:
            marks.append("<- grows most")
        name = module.module if module.layer else "  " + module.module
        growth = f"x{module.growth:.3g}" if module.growth is not None else ""
        rows.append([name, str(module.calls), f"{module.error:.3g}", growth, ", ".join(marks)])
    lines.extend([_columns(header, rows, left=(0, 4)), ""])  # the names and the marks flush left
    if first is None:
        lines.append(f"every layer is within {profile.tolerance:g}: engine and trainer compute the same outputs")
    elif not math.isfinite(first.error):
        lines.append(f"the error enters at {first.module}: not finite ({first.error}): a NaN or infinity on one side")
    else:
        lines.append(f"the error enters at {first.module} ({first.error:.3g}, past {profile.tolerance:g})")
        if grows is not None:
            lines.append(f"it grows most at {grows.module} (x{grows.growth:.3g} over the layer before)")
    for side, modules in (("trainer", profile.only_trainer), ("engine", profile.only_engine)):
        if modules:
            lines.append(f"only the {side} ran: {', '.join(modules)}")
    return "\n".join(lines)


def headline(evidence: Evidence, holding: Holding) -> str:
    """The mismatch log's line in ``verl-events diagnose``: how many lines, and when none of
    them compared anything, why (``verl-events mismatch`` then has nothing to show)."""
    try:
        lines, compared, missing = _scan(evidence)
    except OSError:
        return holding.describe()
    if not compared:
        return f"{lines} mismatch line(s), none compared: {'; '.join(missing) or 'no usable record'}"
    return f"{lines} mismatch line(s)"


def suggestion(evidence: Evidence, holding: Holding) -> str | None:
    """``verl-events mismatch RUN``, when a line of the run compared tokens; else None."""
    try:
        compared = _scan(evidence)[1]
    except OSError:
        return None
    return f"verl-events mismatch {evidence.run}" if compared else None


def _scan(evidence: Evidence) -> tuple[int, bool, list[str]]:
    """(the log's lines, whether one compared tokens, why the others did not): records are read
    only up to the first that compared, the first line of a run whose engine returns log-probs."""
    lines = numbered_lines(mismatch_record.mismatch_log_path(evidence.run))
    missing: set[str] = set()
    for _, line in lines:
        try:
            record = MismatchRecord.from_json(line)
        except ValueError:  # not a record: mismatch itself says so, line by line
            continue
        if record.stats is not None:
            return len(lines), True, []
        if record.missing:
            missing.add(record.missing)
    return len(lines), False, sorted(missing)
