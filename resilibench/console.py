"""Plain-text output shared by the library and the CLI: aligned tables and progress bars on stderr."""

from __future__ import annotations

__all__ = ["format_table", "progress_bar"]

import sys
from collections.abc import Sequence
from typing import Any


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table; numbers right-aligned, floats with 4 decimals."""

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4f}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], int | float) or row[i] is None for row in rows) if rows else False
               for i in range(len(headers))]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def progress_bar(total: int, desc: str):
    """A tqdm bar on stderr (unit "ep" for episodes)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="ep" if desc == "episodes" else "it", dynamic_ncols=True,
                mininterval=0.5, file=sys.stderr)
