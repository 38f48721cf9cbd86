"""Rich tables that cut nothing, and the consoles the commands print them on."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from rich.table import Table

from verl_events.apps.tables import print_table, terminal_console

NAMES = ("ref_compute_log_prob", "actor_compute_log_prob", "rollout_generate")
FIGURES = ("12.5 (n=4)", "1234.5", "0.125", "15.91x*", "rank0")


def figures_table() -> Table:
    table = Table(title="A table wider than its console")
    table.add_column("stage", no_wrap=True)
    for header in ("unprofiled ms", "profiled ms", "MB/step", "ratio", "slowest", "of which hooks"):
        table.add_column(header, justify="right")
    for name in NAMES:
        table.add_row(name, *FIGURES, "9.9")
    return table


def printed(table: Table, width: int) -> str:
    console = Console(file=io.StringIO(), width=width)
    print_table(table, console)
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]


@pytest.mark.parametrize("width", [20, 40, 60, 80])
def test_a_console_narrower_than_the_table_cuts_no_name_and_no_figure(width: int) -> None:
    text = printed(figures_table(), width)
    assert "…" not in text
    for name in NAMES:
        assert re.search(rf"│ {name} +│", text), f"{name} is not whole on one line:\n{text}"
    for figure in ("1234.5", "0.125", "15.91x*", "rank0", "9.9", "(n=4)"):
        assert text.count(figure) == len(NAMES), f"{figure} is cut or missing:\n{text}"
    rows = [line for line in text.splitlines() if any(name in line for name in NAMES)]
    assert all(line.count("│") == 8 for line in rows), f"a column was left out:\n{text}"  # 7 columns


def test_a_name_column_is_never_split_over_two_lines() -> None:
    table = Table()
    table.add_column("observer", no_wrap=True)
    table.add_column("figures")
    table.add_row("tests.support:Capturing, torch_profiler", "1.0 2.0 3.0 4.0 5.0 6.0 7.0 8.0")
    assert "tests.support:Capturing, torch_profiler" in printed(table, 30)


def test_a_table_that_fits_is_printed_as_rich_prints_it() -> None:
    console = Console(file=io.StringIO(), width=200)
    console.print(figures_table())
    assert printed(figures_table(), 200) == console.file.getvalue()  # type: ignore[attr-defined]


def test_a_pipe_gets_the_width_columns_asks_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under pytest stdout and stderr are pipes, as in a log."""
    monkeypatch.setenv("COLUMNS", "60")
    assert terminal_console(stderr=False).width == 60
    assert terminal_console(stderr=True).width == 60


def test_a_pipe_without_columns_gets_120_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert terminal_console(stderr=False).width == 120
