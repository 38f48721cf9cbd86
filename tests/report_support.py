"""The report's two engines side by side (verl_events/apps/report/summary.py: ``records`` and
``duckdb``): each test that reads a run through the report can check that both say the same."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console

from verl_events.apps.report import report

#: Floats may differ in their last bits: DuckDB adds a column's values in another order, and
#: interpolates a median between two values as a + (b - a) / 2 where Python takes (a + b) / 2.
REL = 1e-9


def engine_output(run: Path, engine: str) -> tuple[dict[str, Any], str]:
    """The report of ``run`` by ``engine``: its JSON, and its tables as a terminal shows them."""
    text = report(run, console=Console(file=io.StringIO()), as_json_output=True, quiet=True, engine=engine)
    assert text is not None
    screen = io.StringIO()
    report(run, console=Console(file=screen, width=200), quiet=True, engine=engine)
    return json.loads(text), screen.getvalue()


def differences(a: Any, b: Any, where: str = "$") -> list[str]:
    """Where ``a`` and ``b`` differ: every key, length, string, int and bool exactly, floats to :data:`REL`."""
    if isinstance(a, float) or isinstance(b, float):
        if (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and math.isclose(a, b, rel_tol=REL, abs_tol=1e-15)
        ):
            return []
        return [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a.keys() ^ b.keys())}"]
        return [d for key in a for d in differences(a[key], b[key], f"{where}.{key}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b and type(a) is type(b) else [f"{where}: {a!r} != {b!r}"]


def assert_engines_agree(run: Path) -> dict[str, Any]:
    """Both engines' reports of ``run`` are the same (JSON and tables); the JSON."""
    records, records_text = engine_output(run, "records")
    columnar, columnar_text = engine_output(run, "duckdb")
    found = differences(records, columnar)
    assert not found, "the engines differ:\n" + "\n".join(found[:20])
    assert columnar_text == records_text
    return columnar
