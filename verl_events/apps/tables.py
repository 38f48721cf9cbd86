"""The consoles the commands print on, and rich tables that cut nothing short on them.

rich fits a table to its console by wrapping cells at spaces and, when that is not
enough, by cutting words short with an ellipsis: ``ref_compute_log_p…``, ``33…``.  A
console is narrow in a small terminal window, and in a log (stdout not a terminal),
where rich assumes 80 columns: :func:`terminal_console` gives a pipe 120 unless
``COLUMNS`` says otherwise.  :func:`print_table` gives every column a minimum width,
so that rich may still wrap a cell at its spaces but never cuts a word (a stage,
observer or tool name, a figure); a table wider than its console even so is printed
wider, a row to a line (a terminal wraps those lines, a log keeps them).
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["print_table", "terminal_console"]

_UNBOUNDED = 10_000  # columns: wider than any table


def terminal_console(*, stderr: bool, quiet: bool = False) -> Any:
    """A rich console on stderr or stdout.  Its width: ``COLUMNS`` when set (as rich, argparse
    and shutil read it), else the terminal's; on a pipe without ``COLUMNS``, 120 columns,
    where rich would assume 80: a log gets the tables a row to a line."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    asked = os.environ.get("COLUMNS", "").isdigit()
    return Console(stderr=stderr, quiet=quiet, width=None if asked or stream.isatty() else 120)


def print_table(table: Any, console: Any) -> None:
    """Print a rich ``Table`` of plain-text cells on ``console``, nothing cut.

    Each column's ``min_width`` becomes its longest word, over header and cells; in a
    column made with ``no_wrap=True`` (the names: stages, observers) its longest line,
    so that a name is also never split over two lines.  Changes ``table``'s columns.
    """
    from rich.cells import cell_len

    for column in table.columns:
        texts = [_plain(column.header), *(_plain(cell) for cell in column.cells)]
        pieces = [line for text in texts for line in text.splitlines()] if column.no_wrap else " ".join(texts).split()
        column.min_width = max((cell_len(piece) for piece in pieces), default=1)
    measured = console.measure(table, options=console.options.update(max_width=_UNBOUNDED))
    if measured.minimum > console.width:
        # Left to fit the console, rich would narrow columns past their minimum, down to
        # nothing (a column of width 0 is not drawn at all).  Too wide either way: a row
        # to a line.
        table.width = measured.maximum
    console.print(table, crop=False)


def _plain(cell: Any) -> str:
    """A cell's text: a ``str`` or a rich ``Text`` (``.plain``)."""
    return cell if isinstance(cell, str) else str(getattr(cell, "plain", cell))
