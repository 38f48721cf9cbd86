"""The lists that name the tools agree with the one table (verl_events.apps.tools.TOOLS).

pyproject.toml's entry points and ``verl_events.observers``, the ``verl-events`` parser and
README's list of commands are written by hand; these tests hold each to the table, so a
new tool is added everywhere or the suite says where it is missing.  (OWNERS, the format
owners' list, is held to it in test_owners.py.)
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
from verl_events.apps.tools import TOOLS, Tool, command_module, run_holds

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


def test_every_observer_of_the_table_is_an_entry_point() -> None:
    points = entry_points()
    assert [t.observer for t in TOOLS if t.observer is not None and t.observer not in points] == []


def test_a_row_with_a_format_owner_says_what_its_files_are_called_and_lists_them() -> None:
    for tool in TOOLS:
        assert (tool.owner is None) == (tool.files is None) == (tool.noun == ""), tool.command


def test_the_parser_has_exactly_the_tables_commands_in_its_order() -> None:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(commands.choices) == [tool.command for tool in TOOLS]
    for tool in TOOLS:
        module = command_module(tool)
        assert commands.choices[tool.command].get_default("run_command") is module.command, tool.command


def test_a_command_module_without_add_command_is_named() -> None:
    with pytest.raises(TypeError, match=r"verl_events.apps.jsonl, the module of the 'x' command, has no add_command"):
        command_module(Tool("x", "verl_events.apps.jsonl"))


def readme_commands() -> dict[str, str]:
    """README's list of commands: each row of the table under ``## Commands``, by command."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Commands\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    assert section is not None, "README.md has no '## Commands' section"
    rows = [line for line in section[1].splitlines() if line.startswith("| `verl-events ")]
    return {re.match(r"\| `verl-events (\w+)", row)[1]: row for row in rows}  # type: ignore[index]


def test_readme_lists_every_command_of_the_table_and_no_other() -> None:
    listed = readme_commands()
    assert list(listed) == [tool.command for tool in TOOLS]
    for tool in TOOLS:
        if tool.observer is not None:
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


def test_run_holds_lists_each_tools_files_in_table_order(tmp_path: Path) -> None:
    (tmp_path / "mismatch.jsonl").write_text("")
    (tmp_path / "timing").mkdir()
    (tmp_path / "timing/rank0.jsonl").write_text("")
    held = run_holds(tmp_path)
    assert [(h.tool.command, h.files) for h in held] == [
        ("report", [tmp_path / "timing/rank0.jsonl"]),
        ("mismatch", [tmp_path / "mismatch.jsonl"]),
    ]
    assert [h.describe() for h in held] == ["1 timing log(s)", "1 mismatch record file(s)"]
    assert run_holds(tmp_path / "nothing_here") == []
