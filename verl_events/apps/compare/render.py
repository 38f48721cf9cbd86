"""``verl-events compare``'s verdict, as text."""

from __future__ import annotations

__all__ = ["print_comparison", "tolerances_line"]


def tolerances_line(tolerances: dict[str, dict[str, float]]) -> str:
    """The tolerances judged by, one statistic after another (``--<stat>-rtol``/``-atol``)."""
    each = "; ".join(f"{stat} rtol {t['rtol']:g}, atol {t['atol']:g}" for stat, t in tolerances.items())
    return f"tolerances (close: |a - b| <= atol * M + rtol * |b|, M: B's largest |value|): {each}"


def print_comparison(result: dict[str, object], csv_path: str | None) -> None:
    """The summary of :func:`~.comparison.summary` as text, for ``verl-events compare``."""
    counts = result["counts"]
    assert isinstance(counts, dict)
    print(f"A: {result['a']}\nB: {result['b']}")
    print(tolerances_line(result["tolerances"]))  # type: ignore[arg-type]
    print(", ".join(f"{key.replace('_', ' ')}: {value}" for key, value in counts.items()))
    first = result["first_divergence"]
    if isinstance(first, dict):
        module = f" in module {first['module']}" if first.get("module") else ""
        print(f"DIVERGED. First divergence in execution order: {first['op']}{module}")
        print(f"  {first['entry']}: {first['reason']}")
    else:
        print("MATCH: every entry is matched and within tolerance")
    worst = [item for item in result["worst"] if item["distance"] > 0]  # type: ignore[attr-defined]
    if worst:
        print("Furthest from tolerance (|a-b| / tolerance; above 1 diverged):")
        print("  a statistic below a tenth of its op's scale counts as that tenth, so near-zero noise ranks low")
        for item in worst:
            module = f" [{item['module']}]" if item["module"] else ""
            reason = f"  ({item['reason']})" if item["reason"] else ""
            print(f"  {item['distance']:>10.3g}  {item['entry']}{module}{reason}")
    if csv_path:
        print(f"Full table: {csv_path}")
