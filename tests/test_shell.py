"""The shell every command runs in: warnings, notes, ``--json``, ``error:`` and the exit code."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

import pytest

from verl_events.apps import shell


class BadRun(ValueError):
    """A reader's input error."""


@dataclass
class Found:
    alarms: int
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run(found: Found | Exception, *, as_json: bool = False, after: bool = False) -> int:
    def read() -> Found:
        if isinstance(found, Exception):
            raise found
        return found

    def finish(result: Found) -> None:
        print("wrote: figure.png")

    return shell.run(
        argparse.Namespace(json=as_json),
        read,
        BadRun,
        text=lambda result: f"{result.alarms} alarm(s)",
        as_json=lambda result: {"alarms": result.alarms, "ratio": 0.5},
        exit_code=lambda result: 1 if result.alarms else 0,
        warnings=lambda result: result.warnings,
        notes=lambda result: result.notes,
        after=finish if after else None,
    )


def test_warnings_then_notes_go_to_stderr_and_the_text_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(Found(0, ["a line skipped"], ["a dump of rank 1 used"])) == 0
    out, err = capsys.readouterr()
    assert out == "0 alarm(s)\n"
    assert err == "warning: a line skipped\nnote: a dump of rank 1 used\n"


def test_json_is_printed_with_indent_one_and_the_exit_rule_decides_the_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(Found(2), as_json=True) == 1
    out = capsys.readouterr().out
    assert out == json.dumps({"alarms": 2, "ratio": 0.5}, indent=1) + "\n"


def test_the_input_error_is_one_error_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(BadRun("run/ does not exist; pass the save_path of a run")) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: run/ does not exist; pass the save_path of a run\n"


def test_another_exception_is_not_taken_for_bad_input() -> None:
    with pytest.raises(KeyError):
        run(KeyError("a bug"))


def test_after_speaks_last_and_a_command_without_json_prints_text() -> None:
    printed: list[str] = []

    def text(result: int) -> None:  # prints itself, as a rich console does
        printed.append(f"text {result}")

    code = shell.run(
        argparse.Namespace(),  # no --json at all, as check
        lambda: 3,
        BadRun,
        text=text,
        after=lambda result: printed.append(f"after {result}"),
    )
    assert code == 0 and printed == ["text 3", "after 3"]


def test_fail_says_error_and_returns_the_code_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert shell.fail("rank 1 failed", code=1) == 1
    assert capsys.readouterr().err == "error: rank 1 failed\n"
