"""``verl-events gather RUN --ray ADDRESS --out DIR``: a run kept on each node's own disk, in one folder.

RUN is the run's folder as every node sees it: an absolute path, where ``{node}``
stands for the node's part when the run's save_path had one (``{node}``: Ray's node
id, :func:`verl_events.layout.node_name`), e.g. ``/local_disk/verl_events/latest``
or ``/shared/runs/{node}/latest``.  One Ray task on each node of the cluster at
ADDRESS reads that node's folder (:mod:`.cluster`, :mod:`.node`); the files go into
DIR by the rules of :mod:`.folder`, with a manifest (``gather.json``), and every
reader takes DIR as it takes a save_path.

Without ``--all`` only the small files come: records, heartbeats, reports
(``.json``, ``.jsonl``, ``.txt`` outside the step tree, up to ``--max-file-mb`` each);
msprobe dumps and profiler traces stay on the nodes, counted.

Exit codes: 0 every node answered; 1 a node could not be reached (dead, its task
failed, no answer within ``--timeout``): what the others hold is gathered and the
manifest lists it; 2 bad input (RUN not absolute or with another placeholder, DIR
holding something else, no Ray cluster at ADDRESS, no node holding RUN).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from verl_events.layout import NODE_PLACEHOLDER

from .. import shell
from .cluster import NodeAnswer, ask_every_node
from .folder import DIFFERING, MANIFEST, NAME_TAKEN, GatheredFolder, GatherInputError, check_out, node_label
from .node import DEFAULT_MAX_BYTES, SKIPPED_STEPS

__all__ = ["add_command", "command", "gather"]

_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def check_run(run: str) -> str:
    """``run`` when every node can resolve it; GatherInputError naming what is wrong."""
    for found in _PLACEHOLDER.findall(run):
        if found != NODE_PLACEHOLDER:
            raise GatherInputError(
                f"RUN {run!r} holds {found!r}; the only placeholder is {NODE_PLACEHOLDER} (each node's part). "
                "Give the run's own folder: its id, or latest beside it"
            )
    if not run.startswith(("/", "~")):
        raise GatherInputError(f"RUN {run!r} is read on every node: give an absolute path")
    return run


def gather(run: str, address: str, out: Path, *, everything: bool, max_bytes: int, timeout: float) -> dict[str, Any]:
    """Gather ``run`` from every node of the cluster at ``address`` into ``out``; the manifest
    (also written to ``out``).  GatherInputError for bad input (exit 2)."""
    check_run(run)
    check_out(out, run)
    folder = GatheredFolder(out)
    answers: list[NodeAnswer] = []

    def take(answer: NodeAnswer) -> None:
        answers.append(answer)
        if answer.folder is not None:
            folder.add(answer.node, answer.folder)
            answer.folder.files.clear()  # written: one node's files are held at a time

    try:
        ask_every_node(address, run, everything=everything, max_bytes=max_bytes, timeout=timeout, on_answer=take)
        holding = [a for a in answers if a.folder is not None and a.folder.folder is not None]
        if not holding and all(a.why is None for a in answers):
            raise GatherInputError(f"no node of the cluster at {address} holds {run} ({len(answers)} node(s) asked)")
        manifest = _manifest(run, address, everything, max_bytes, answers, folder)
        folder.finish(manifest)
    except BaseException:
        folder.discard()
        raise
    return manifest


def _manifest(
    run: str, address: str, everything: bool, max_bytes: int, answers: list[NodeAnswer], folder: GatheredFolder
) -> dict[str, Any]:
    return {
        "source": run,
        "ray": address,
        "all": everything,
        "max_file_bytes": None if everything else max_bytes,
        "time": time.time(),
        "files": folder.files,
        "bytes": folder.bytes,
        "nodes": [_node_entry(answer) for answer in answers],
        "merged": sorted(folder.merged),
        "renamed": folder.renamed,
        "unreachable": [answer.node for answer in answers if answer.why is not None],
    }


def _node_entry(answer: NodeAnswer) -> dict[str, Any]:
    entry: dict[str, Any] = {"node": answer.node, "address": answer.address, "host": answer.host}
    found = answer.folder
    if found is None:
        return {**entry, "state": "unreachable", "why": answer.why}
    if found.folder is None:
        return {**entry, "state": "no folder", "why": None}
    return {
        **entry,
        "state": "gathered",
        "why": None,
        "folder": found.folder,
        "files": found.sent_files,
        "bytes": found.sent_bytes,
        "skipped": {why: {"files": n, "bytes": size} for why, (n, size) in found.skipped.items()},
        "large": [{"path": path, "bytes": size} for path, size in found.large],
        "unreadable": [{"path": path, "error": error} for path, error in found.unreadable],
    }


def render(manifest: dict[str, Any], out: Path) -> str:
    nodes = manifest["nodes"]
    gathered = [n for n in nodes if n["state"] == "gathered"]
    lines = [
        f"gathered {manifest['source']} from {len(gathered)} of {len(nodes)} node(s) into {out}: "
        f"{manifest['files']} file(s), {_size(manifest['bytes'])}"
    ]
    for node in nodes:
        name = f"node {node_label(node['node'])} ({node['address']}, {node['host']})"
        if node["state"] == "unreachable":
            lines.append(f"  {name}: UNREACHABLE, {node['why']}")
        elif node["state"] == "no folder":
            lines.append(f"  {name}: holds no such folder (it ran no process of this run, or RUN is not its path)")
        else:
            lines.append(f"  {name}: {node['files']} file(s), {_size(node['bytes'])} from {node['folder']}")
            for why, left in node["skipped"].items():
                more = " (--all takes them)" if why == SKIPPED_STEPS else ""
                lines.append(f"    left there: {left['files']} file(s), {_size(left['bytes'])}: {why}{more}")
            lines += [f"    left there: {big['path']}, {_size(big['bytes'])}, over the limit" for big in node["large"]]
            lines += [f"    not readable: {item['path']}: {item['error']}" for item in node["unreadable"]]
    if manifest["merged"]:
        lines.append(f"merged, node after node: {', '.join(manifest['merged'])}")
    lines += [_renamed(item) for item in manifest["renamed"]]
    if manifest["unreachable"]:
        lines.append(f"{len(manifest['unreachable'])} node(s) could not be reached: their files are not in {out}")
    lines.append(f"manifest: {out / MANIFEST}")
    return "\n".join(lines)


def _renamed(item: dict[str, str]) -> str:
    """A copy kept under another name, and why (:mod:`.folder`)."""
    node, named = node_label(item["node"]), node_label(item["named"])
    if item["why"] == DIFFERING:
        kept = f"node {node}'s is {item['kept_as']}"
        return f"differing copies of {item['path']}: node {named}'s (the newest) keeps the name, {kept}"
    if item["why"] == NAME_TAKEN:
        return f"node {node}'s {item['path']} is {item['kept_as']}: its name holds node {named}'s copy"
    return f"node {node}'s {item['path']} is {item['kept_as']}: {item['why']} (node {named}'s keeps the name)"


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


#: The command's line in ``verl-events --help``; the others, what RUN is and what ``--json`` prints.
HELP = (
    "collect a run kept on each node's own disk into one folder, through Ray "
    "(exit 0 every node, 1 a node unreachable, 2 bad input)"
)
RUN_HELP = (
    f"the run's folder as every node sees it: an absolute path, {NODE_PLACEHOLDER} for the node's part "
    "(e.g. /local_disk/verl_events/latest)"
)
JSON_HELP = "print the manifest as JSON"


def add_command(commands: Any) -> None:
    """Add ``gather`` to the ``verl-events`` parser's subcommands."""
    parser = shell.add_run_command(commands, "gather", command, help=HELP, run=RUN_HELP, json_help=JSON_HELP)
    parser.add_argument("--ray", required=True, metavar="ADDRESS", help="the job's Ray cluster: its head's HOST:PORT")
    parser.add_argument(
        "--out", required=True, type=Path, help="the folder to gather into: new, empty, or an earlier gather of RUN"
    )
    parser.add_argument("--all", action="store_true", help="every file: msprobe dumps and profiler traces too")
    parser.add_argument(
        "--max-file-mb",
        type=float,
        default=DEFAULT_MAX_BYTES / 2**20,
        help="without --all, a larger file is left on its node (default %(default)g)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the nodes (default 120)")


def command(args: Any) -> int:
    """``verl-events gather RUN --ray ADDRESS --out DIR``; the exit code (see the module docstring)."""
    max_bytes = int(args.max_file_mb * 2**20)
    return shell.run(
        args,
        lambda: gather(args.run, args.ray, args.out, everything=args.all, max_bytes=max_bytes, timeout=args.timeout),
        GatherInputError,
        text=lambda manifest: render(manifest, args.out),
        as_json=lambda manifest: manifest,
        exit_code=lambda manifest: 1 if manifest["unreachable"] else 0,
    )
