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
OBSERVERS = PACKAGE.parent / "observers"

# name in a string literal -> the one module that may write it
OWNERS = {
    "step_": "verl_events/_paths.py",
    "dump.json": "observers/msprobe/layout.py",
    "stack.json": "observers/msprobe/layout.py",
    "construct.json": "observers/msprobe/layout.py",
    "session.incomplete": "observers/msprobe/layout.py",
    "anomalies.jsonl": "observers/sentinel/record.py",
    "run.json": "verl_events/_run.py",
    "hangs.jsonl": "observers/watchdog/record.py",
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
TIMING_OWNER = "observers/timing.py"


def modules() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *OBSERVERS.rglob("*.py")])


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings (or bare string statements)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.add(id(node.value))
    return found


def timing_folder_literals(tree: ast.AST, skip: set[int]) -> list[int]:
    """Lines where ``"timing"`` is a path part: joined with ``/`` or written as ``timing/...``."""
    lines = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value == "timing":
                    lines.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "timing/" in node.value:
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
        if relative != TIMING_OWNER:
            offenders += [
                f"{relative}:{line}: the timing folder (owner {TIMING_OWNER})"
                for line in timing_folder_literals(tree, skip)
            ]
    assert offenders == []


def test_the_walk_sees_the_owners() -> None:
    """The test above looks where the formats are defined (it cannot pass by looking nowhere)."""
    sources = {path.relative_to(PACKAGE.parent).as_posix(): path.read_text(encoding="utf-8") for path in modules()}
    for name, owner in OWNERS.items():
        assert repr(name)[1:-1] in sources[owner], f"{owner} no longer defines {name!r}"
    assert 'TIMING_DIR = "timing"' in sources[TIMING_OWNER]


def test_no_module_of_the_package_is_over_400_lines() -> None:
    long = [
        f"{path.relative_to(PACKAGE.parent)}: {count} lines"
        for path in modules()
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > 400
    ]
    assert long == []
