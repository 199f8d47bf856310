"""Progress bars for the commands that can take more than a couple of seconds.

One switch for the whole process: a bar is drawn on standard error only when standard error is a
terminal, the command does not print JSON (`--json` calls `set_enabled(False)`), and
`SIMTRAIN_PROGRESS` is not `0`. A bar appears only once its work has taken two seconds, so quick
commands print nothing extra. The bars are tqdm's (a count, a rate and an ETA); nothing the
simulator computes depends on them.

    with bar(total=len(points), desc="sweep", unit="point") as b:
        for p in points:
            ...
            b.update()
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")

DELAY_S = 2.0          # a bar appears only after this long
_state = {"enabled": True}


def set_enabled(flag: bool) -> None:
    """Turn every later bar of this process on or off (off under `--json`)."""
    _state["enabled"] = bool(flag)


def enabled() -> bool:
    """Whether a bar would be drawn now: switched on, `SIMTRAIN_PROGRESS` not 0, stderr a terminal."""
    if not _state["enabled"] or os.environ.get("SIMTRAIN_PROGRESS", "") == "0":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def bar(total: int | None, desc: str, unit: str = "it") -> tqdm:
    """A bar over `total` units (None: a count without an ETA); a no-op object when not enabled.

    Use it as a context manager and call `update(n)` as work completes."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled(), delay=DELAY_S,
                file=sys.stderr, dynamic_ncols=True, leave=False)


def track(items: Iterable[T], total: int | None, desc: str, unit: str = "it") -> Iterator[T]:
    """Yield from items with a bar advancing once per item."""
    with bar(total, desc, unit) as b:
        for item in items:
            yield item
            b.update(1)
