"""The lists that name the tools agree with what the observers declare.

The read side's tools (verl_events.apps.tools.tools()) and the ``verl-events`` parser are
derived from each observer's ``writes``; pyproject.toml's entry points, ``verl_events.observers``
and README's list of commands are written by hand, and these tests hold each to the derived
list, so a new tool is added everywhere or the suite says where it is missing.  (OWNERS, the
format owners' list, is held to it in test_owners.py; a tool from another package, in
test_declared_tool.py.)
"""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest
import tomllib

from verl_events import observers
from verl_events.apps.cli import build_parser
from verl_events.apps.tools import Tool, command_module, command_tools, run_holds, tools

REPO = Path(__file__).resolve().parents[1]
GROUP = "verl_events.observers"
TESTING_ONLY = {"recording"}  # verl_events.testing's RecordingObserver, for users' tests


def entry_points() -> dict[str, str]:
    """pyproject.toml's observers, by name: ``module:attribute``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return dict(project["entry-points"][GROUP])


def load(target: str) -> object:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def test_every_entry_point_is_a_name_of_the_observers_package() -> None:
    names = {name: target for name, target in entry_points().items() if name not in TESTING_ONLY}
    assert names, "pyproject.toml lists no observers"
    for name, target in names.items():
        attribute = target.partition(":")[2]
        assert attribute in observers.__all__, f"entry point {name!r}: {attribute} is not in verl_events.observers"
        assert getattr(observers, attribute) is load(target), f"entry point {name!r} and verl_events.observers differ"


def test_every_folder_of_python_code_is_a_package_that_setuptools_finds() -> None:
    """pyproject.toml lists no packages: setuptools finds those under verl_events/, so a new
    folder (apps/report/) must be a package, with an ``__init__.py``, to be installed."""
    import setuptools

    find = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    found = set(setuptools.find_packages(str(REPO), include=find["find"]["include"]))
    folders = {
        ".".join(path.parent.relative_to(REPO).parts)
        for path in (REPO / "verl_events").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert sorted(folders - found) == []
    assert "verl_events.observers.watchdog" in found  # the walk sees the observers


def commands() -> list[str]:
    return [str(tool.command) for tool in command_tools()]


def test_every_observer_that_writes_under_save_path_is_a_tool_and_an_entry_point() -> None:
    """Every built-in observer that writes declares it, so check and diagnose know its files
    (memory, whose logs report reads, and tracker and the profilers, which have no command)."""
    points = entry_points()
    listed = {tool.observer for tool in tools() if tool.observer is not None}
    assert listed <= set(points)
    writers = {name for name, target in points.items() if getattr(load(target), "writes", None) is not None}
    assert listed == writers - {"precision_debugger"}  # msprobe's second name
    assert {"memory", "tracker", "nsys", "npu", "torch_profiler", "timing", "watchdog"} <= listed


def test_a_tool_says_what_its_files_are_called_and_lists_them() -> None:
    for tool in tools():
        assert (tool.owner is None) == (tool.files is None) == (tool.noun == ""), tool.name


def test_the_parser_has_exactly_the_tools_commands_in_their_order() -> None:
    parsed = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(parsed.choices) == commands()
    for tool in tools():
        if tool.command is None:
            continue
        module = command_module(tool)
        assert parsed.choices[tool.command].get_default("run_command") is module.command, tool.command


def test_a_command_module_without_add_command_is_named() -> None:
    with pytest.raises(
        TypeError, match=r"verl_events.apps.read.jsonl, the module of the 'x' command, has no add_command"
    ):
        command_module(Tool("x", "verl_events.apps.read.jsonl"))


def readme_commands() -> dict[str, str]:
    """README's list of commands: each row of the table under ``## Commands``, by command."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Commands\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    assert section is not None, "README.md has no '## Commands' section"
    rows = [line for line in section[1].splitlines() if line.startswith("| `verl-events ")]
    return {re.match(r"\| `verl-events (\w+)", row)[1]: row for row in rows}  # type: ignore[index]


def test_readme_lists_every_command_and_no_other() -> None:
    listed = readme_commands()
    assert list(listed) == commands()
    for tool in tools():
        if tool.observer is not None and tool.command is not None:
            assert f"`{tool.observer}`" in listed[tool.command], (
                f"README: {tool.command} reads the {tool.observer}'s files"
            )


def test_readme_keeps_two_set_up_commands_the_demo_and_the_tests() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## The two commands\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    assert section is not None
    blocks = re.findall(r"```bash\n(.*?)```", section[1], flags=re.S)
    commands = [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]


def test_run_holds_lists_each_tools_files_in_order(tmp_path: Path) -> None:
    (tmp_path / "mismatch.jsonl").write_text("")
    (tmp_path / "timing").mkdir()
    (tmp_path / "timing/rank0.jsonl").write_text("")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory/rank0.jsonl").write_text("")
    held = run_holds(tmp_path)
    assert [(h.tool.name, h.files) for h in held] == [  # by command (report reads memory and timing), then name
        ("mismatch", [tmp_path / "mismatch.jsonl"]),
        ("memory", [tmp_path / "memory/rank0.jsonl"]),
        ("timing", [tmp_path / "timing/rank0.jsonl"]),
    ]
    assert [h.describe() for h in held] == ["1 mismatch record file(s)", "1 memory log(s)", "1 timing log(s)"]
    assert run_holds(tmp_path / "nothing_here") == []
