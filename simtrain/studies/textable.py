"""Text tables of the studies (compare, sweep) that never cut the column telling rows apart.

On a terminal narrower than the table, the other columns are left out, least important first;
if the distinguishing column alone is still too wide, its cells wrap onto continuation lines at
the spaces between `key=value` items. No cell of it is ever cut. Off a terminal (a pipe, a file)
the table is as wide as its content, unless `COLUMNS` says otherwise.

>>> cols = [Column("point", key=True), Column("step", ">", drop=1), Column("mfu", ">", drop=0)]
>>> print("\\n".join(render(cols, [["a.very.long.key=1 b=2", "1.0 s", "40%"]], width=31)))
  point                    step
  ---------------------   -----
  a.very.long.key=1 b=2   1.0 s
>>> print("\\n".join(render(cols, [["a.very.long.key=1 b=2", "1.0 s", "40%"]], width=20)))
  point
  ------------------
  a.very.long.key=1
    b=2
"""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Column:
    header: str
    align: str = "<"           # "<" or ">"
    key: bool = False          # the distinguishing column: never left out, never cut
    drop: int = 0              # the order columns are left out in when too wide: lowest first


def terminal_width() -> int | None:
    """`COLUMNS` when set, else the width of the terminal standard output is on; None off a terminal."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if sys.stdout.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


def _wrap(text: str, width: int) -> list:
    """Split at spaces into lines of at most `width` (a longer item keeps its own line, whole)."""
    lines, cur = [], ""
    for item in text.split(" "):
        if cur and len(cur) + 1 + len(item) > width:
            lines.append(cur)
            cur = item
        else:
            cur = f"{cur} {item}" if cur else item
    lines.append(cur)
    return lines


def render(columns: Sequence[Column], rows: Sequence[Sequence[str] | tuple[str, str]], width: int | None = None,
           indent: str = "  ") -> list:
    """The table's lines. A row is one cell per column, or (key cell, message): a message row,
    e.g. an invalid variant's error, printed whole after its key cell."""
    cells = [r for r in rows if len(r) == len(columns)]
    widths = [max([len(c.header)] + [len(r[i]) for r in cells] + ([len(r[0]) for r in rows] if c.key else []))
              for i, c in enumerate(columns)]
    shown = list(range(len(columns)))
    kcol = next((i for i, c in enumerate(columns) if c.key), 0)
    # the narrowest the key column can wrap to: its longest item, which is never split
    kmin = max([len(columns[kcol].header)] + [len(x) for r in rows for x in r[0].split(" ")])

    def total(ix: list, kw: int) -> int:
        return len(indent) + sum(kw if i == kcol else widths[i] for i in ix) + 3 * (len(ix) - 1)

    w = dict(zip(range(len(columns)), widths))
    if width is not None:
        for i in sorted((i for i, c in enumerate(columns) if not c.key), key=lambda i: columns[i].drop):
            if total(shown, widths[kcol]) <= width:
                break
            # keep the column if wrapping the key column to its longest item makes room for it
            if total(shown, kmin) > width or total([j for j in shown if j != i], widths[kcol]) <= width:
                shown.remove(i)
        if total(shown, widths[kcol]) > width:
            w[kcol] = max(kmin, width - (total(shown, widths[kcol]) - widths[kcol]))

    def line(vals: dict) -> str:
        return (indent + "   ".join(f"{vals.get(i, ''):{columns[i].align}{w[i]}}" for i in shown)).rstrip()

    out = [line({i: columns[i].header for i in shown}), indent + "   ".join("-" * w[i] for i in shown)]
    for r in rows:
        key_lines = _wrap(r[0], w[kcol]) if len(r[0]) > w[kcol] else [r[0]]
        if len(r) != len(columns):
            out.append(f"{indent}{key_lines[0]:<{w[kcol]}}   {r[1]}" if len(key_lines) == 1 else indent + key_lines[0])
            out += [indent + "  " + k for k in key_lines[1:-1]]
            if len(key_lines) > 1:
                out.append(f"{indent}  {key_lines[-1]}   {r[1]}")
            continue
        out.append(line({i: (key_lines[0] if i == kcol else r[i]) for i in shown}))
        out += [indent + "  " + k for k in key_lines[1:]]
    return out
