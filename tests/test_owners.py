"""Every on-disk format has one owner module, and every reader imports it.

The names of a layout (``step_``, ``dump.json``, ``anomalies.jsonl``, ...)
are written as literals only in the module that defines the format; any
other module of the package spells them through the owner's constants and
functions.  Docstrings may describe a layout: they are not code.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import verl_events

PACKAGE = Path(verl_events.__file__).parent

# name in a string literal -> the one module that may write it
OWNERS = {
    "step_": "verl_events/run/paths.py",
    "dump.json": "verl_events/observers/msprobe/layout.py",
    "stack.json": "verl_events/observers/msprobe/layout.py",
    "construct.json": "verl_events/observers/msprobe/layout.py",
    "session.incomplete": "verl_events/observers/msprobe/layout.py",
    "dump_tensor_data": "verl_events/observers/msprobe/layout.py",
    "anomalies.jsonl": "verl_events/observers/sentinel/record.py",
    "replays.jsonl": "verl_events/observers/sentinel/record.py",
    "inputs_rank": "verl_events/observers/sentinel/record.py",  # a replay's kept inputs, inputs_rank{R}.pt
    "run.json": "verl_events/run/identity.py",
    "hangs.jsonl": "verl_events/observers/watchdog/record.py",
    "mismatch.jsonl": "verl_events/observers/mismatch/record.py",
    "weight_sync.jsonl": "verl_events/observers/weight_sync/record.py",
    "checkpoints.jsonl": "verl_events/observers/checkpoint/record.py",
    "ends.jsonl": "verl_events/observers/watchdog/crash.py",
}
# A folder under save_path -> the one module that may name it.  A folder's name is also
# a word ("timing", "hangs"), so only its use as a path part counts: joined with ``/``,
# or written as ``name/...``.
FOLDERS = {
    "timing": "verl_events/observers/timing.py",
    "heartbeats": "verl_events/observers/watchdog/record.py",
    "hangs": "verl_events/observers/watchdog/record.py",  # the hang reports
    "crashes": "verl_events/observers/watchdog/crash.py",  # crash records, fatal dumps, ends.jsonl
    "memory": "verl_events/observers/memory/record.py",
}
# Each name as a layout uses it: a file name on its own (not ``data_dump.json_writer``),
# and ``step_`` before a step (``step_3``, ``step_{N}``, ``step_*``, ``step_unknown``), not
# in a function's name (``step_dir_name``).
PATTERNS = {
    name: re.compile(
        r"(?<![A-Za-z0-9])step_(?=[0-9*{]|unknown|$)" if name == "step_" else rf"(?<!\w){re.escape(name)}(?!\w)"
    )
    for name in OWNERS
}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings (or bare string statements)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.add(id(node.value))
    return found


def folder_literals(tree: ast.AST, skip: set[int], folder: str) -> list[int]:
    """Lines where ``folder`` is a path part: joined with ``/`` or written as ``folder/...``."""
    lines = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value == folder:
                    lines.append(node.lineno)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.search(rf"(?<!\w){folder}/", node.value)
        ):
            lines.append(node.lineno)
    return lines


def test_layout_names_are_written_only_by_their_owner() -> None:
    offenders = []
    for path in modules():
        relative = path.relative_to(PACKAGE.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
                continue
            for name, owner in OWNERS.items():
                if relative != owner and PATTERNS[name].search(node.value):
                    offenders.append(f"{relative}:{node.lineno}: {name!r} (owner {owner})")
        for folder, owner in FOLDERS.items():
            if relative != owner:
                offenders += [
                    f"{relative}:{line}: the {folder} folder (owner {owner})"
                    for line in folder_literals(tree, skip, folder)
                ]
    assert offenders == []


def test_the_walk_sees_the_owners() -> None:
    """The test above looks where the formats are defined (it cannot pass by looking nowhere)."""
    sources = {path.relative_to(PACKAGE.parent).as_posix(): path.read_text(encoding="utf-8") for path in modules()}
    for name, owner in OWNERS.items():
        assert repr(name)[1:-1] in sources[owner], f"{owner} no longer defines {name!r}"
    for folder, owner in FOLDERS.items():
        assert f'= "{folder}"' in sources[owner], f"{owner} no longer defines the {folder} folder"


def test_no_module_of_the_package_is_over_400_lines() -> None:
    long = [
        f"{path.relative_to(PACKAGE.parent)}: {count} lines"
        for path in modules()
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > 400
    ]
    assert long == []


def test_every_format_owner_of_the_tools_has_its_files_in_owners() -> None:
    """Each file and folder name the format owner of a tool with a command defines (its ``*_LOG``,
    ``*_FILE``, ``*_DIR`` and ``*_MARKER`` constants) is held to that owner above."""
    from verl_events.apps.tools import tools

    owned = {**OWNERS, **FOLDERS}
    missing = []
    for module in {tool.owner for tool in tools() if tool.owner is not None and tool.command is not None}:
        owner = Path(module.__file__ or "").resolve().relative_to(PACKAGE.parent.resolve()).as_posix()
        names = [
            value
            for constant, value in vars(module).items()
            if constant.isupper() and constant.endswith(("_LOG", "_FILE", "_DIR", "_MARKER")) and isinstance(value, str)
        ]
        assert names, f"{owner} defines no file names"
        missing += [f"{owner}: {name!r}" for name in names if owned.get(name) != owner]
    assert missing == []
