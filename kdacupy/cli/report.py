"""What the forward and backward bench runs record and print alike: the geometric mean of
FLA / kdacupy over the Kimi shapes, the JSON record, and the tables' frame (header, rule, a failed
shape's line) and FLA's cells."""
from __future__ import annotations

import json
import math
from pathlib import Path


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def kimi_ratios(rows) -> list:
    """FLA / kdacupy of each Kimi shape (None where FLA did not run)."""
    return [r.get("ratio_fla_over_kdacupy") for r in rows if r["shape"]["name"].startswith("kimi-")]


def write_json(path, doc) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def table_lines(head: str, rows, line) -> list[str]:
    """The header, its rule, and a line per row: ``line(row)``, or a failed shape's error."""
    return [head, "-" * len(head)] + [error_line(r) if r.get("error") else line(r) for r in rows]


def error_line(row) -> str:
    return f"{row['shape']['name']:<24} ERROR: {row['error'][:200]}"


def fla_cells(row) -> tuple[str, str]:
    """The 'FLA ms' and 'FLA/kda' cells: '-' where FLA did not run, 'error' where it failed."""
    f = row["fla"] or {}
    fms = f"{f['median_ms']:8.3f}" if f.get("median_ms") else ("   error" if f.get("error") else "       -")
    ratio = f"{row['ratio_fla_over_kdacupy']:7.2f}" if row["ratio_fla_over_kdacupy"] else "      -"
    return fms, ratio
