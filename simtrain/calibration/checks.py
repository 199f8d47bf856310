"""Checks every measurement of a calibration input before it is used.

Each value is checked for its type (a whole number, a finite number, text, true/false) and for
a range a real measurement can have; a problem goes to the file's Collector at the value's key
path, so a bad input is one line `<file>: <key.path>: <problem>; <fix>`. The ranges are
assumed bounds, chosen wide enough for any machine built today and narrow enough that a
typo or a corrupted file is caught:

  tensor dimension (GEMM m, n, k; a trace's input dims)   1 .. 2^31 - 1 (an int32 index)
  bytes / elements of one measurement                      1 .. 2^40 (1 TiB)
  attention batch, heads, head_dim / seq                   1 .. 2^20, 2^16, 2^16 / 2^24
  ranks of a collective / nodes                            2 .. 2^20 / 1 .. ranks
  a measured time (median, percentiles)                    1 ns .. 3600 s

Also here: reading an input file through the guarded reader (regular files only, bounded size,
gzip bounded when decompressed), and the warning when measurements come from another kind of
device than the base preset.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from simtrain.errors import Collector
from simtrain.spec.files import MAX_FILE_BYTES, TreeError, decode_text, gunzip, parse_json, parse_yaml, read_bytes, short

MAX_DIM = 2**31 - 1
MAX_BYTES = 2**40
MIN_TIME_S = 1e-9
MAX_TIME_S = 3600.0
MAX_TRACE_BYTES = 128 * 2**20      # a trace (.json, or .json.gz once decompressed)
MAX_PROBLEMS = 20                  # problems reported per file; the rest are counted
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "sendrecv")


class Checker:
    """Checks values into a Collector, stopping after MAX_PROBLEMS (a broken trace of a million
    events gives twenty lines and a count, not a million lines)."""

    def __init__(self, errs: Collector, fix: str):
        self.errs = errs
        self.fix = fix
        self.more = 0

    def add(self, path: str, problem: str, fix: str | None = None) -> None:
        if len(self.errs.problems) >= MAX_PROBLEMS:
            self.more += 1
            return
        self.errs.add(path, problem, fix or self.fix)

    def finish(self) -> None:
        """Raises the problems found, if any."""
        if self.more:
            self.errs.add("", f"{self.more} more problems not listed", "fix the ones listed first")
        self.errs.raise_if_any()

    @property
    def full(self) -> bool:
        return len(self.errs.problems) >= MAX_PROBLEMS

    def whole(self, v: Any, path: str, lo: int = 1, hi: int = MAX_DIM) -> int | None:
        """A whole number in [lo, hi], else None (and a problem)."""
        if isinstance(v, bool) or not isinstance(v, int):
            self.add(path, f"expected a whole number, got {short(v, 60)}")
            return None
        if v < lo:
            self.add(path, f"must be > 0, got {short(v, 60)}" if lo == 1 else f"must be >= {lo}, got {short(v, 60)}")
            return None
        if v > hi:
            self.add(path, f"{short(v, 60)} is beyond any real measurement (must be <= {hi:,})")
            return None
        return v

    def number(self, v: Any, path: str, lo: float, hi: float, lo_open: bool = False, what: str = "") -> float | None:
        """A finite number in [lo, hi] (lo excluded when lo_open), else None (and a problem)."""
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.add(path, f"expected a number{what}, got {short(v, 60)}")
            return None
        x = float(v) if not isinstance(v, int) or v.bit_length() < 1000 else math.inf
        if not math.isfinite(x):
            self.add(path, f"must be finite, got {short(v, 60)}")
            return None
        if x < lo or (lo_open and x == lo):
            self.add(path, f"must be {'>' if lo_open else '>='} {lo:g}{what}, got {short(v, 60)}")
            return None
        if x > hi:
            self.add(path, f"{short(v, 60)} is beyond any real measurement (must be <= {hi:g}{what})")
            return None
        return x

    def seconds(self, v: Any, path: str) -> float | None:
        """A measured time in seconds: finite, > 0, 1 ns .. 3600 s."""
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v <= 0:
            self.add(path, f"must be > 0, got {v}: a measured time is positive")
            return None
        return self.number(v, path, MIN_TIME_S, MAX_TIME_S, what=" s")

    def text(self, v: Any, path: str) -> str | None:
        if not isinstance(v, str):
            self.add(path, f"expected text, got {short(v, 60)}")
            return None
        return v

    def flag(self, v: Any, path: str) -> bool | None:
        if not isinstance(v, bool):
            self.add(path, f"expected true or false, got {short(v, 60)}")
            return None
        return v

    def mapping(self, v: Any, path: str) -> dict | None:
        if not isinstance(v, dict):
            self.add(path, f"expected a mapping, got {short(v, 60)}")
            return None
        return v

    def records(self, v: Any, path: str) -> list:
        """(index, record) of a list of mappings; a problem for each entry that is not one."""
        if v is None:
            return []
        if not isinstance(v, list):
            self.add(path, f"expected a list of records, got {short(v, 60)}")
            return []
        out = []
        for i, r in enumerate(v):
            if self.mapping(r, f"{path}[{i}]") is not None:
                out.append((i, r))
        return out


def read_input(path: Path, errs: Collector, fix: str) -> bytes:
    """The bytes of an input file (at most MAX_TRACE_BYTES; other kinds are held to
    MAX_FILE_BYTES by `text_of`); a special file or a missing one is one problem, raised."""
    try:
        return read_bytes(path, MAX_TRACE_BYTES)
    except TreeError as e:
        errs.add("", str(e), fix)
        errs.raise_if_any()
    raise AssertionError("unreachable")


def text_of(raw: bytes, errs: Collector, fix: str) -> str:
    """The UTF-8 text of a log or calibration file of at most MAX_FILE_BYTES."""
    try:
        if len(raw) > MAX_FILE_BYTES:
            raise TreeError(f"is {len(raw) / 2**20:.1f} MiB; input files of at most {MAX_FILE_BYTES // 2**20} MiB are read")
        return decode_text(raw)
    except TreeError as e:
        errs.add("", str(e), fix)
        errs.raise_if_any()
    raise AssertionError("unreachable")


def tree_of(text: str, kind: str, errs: Collector, fix: str) -> Any:
    """A YAML or JSON tree read as scenarios are (safe YAML, no duplicate keys, depth and alias
    limits); a problem is one line at the file, raised."""
    try:
        return parse_yaml(text) if kind == "yaml" else parse_json(text)
    except TreeError as e:
        problem, _, own = str(e).partition("; ")
        errs.add("", problem, own or fix)
        errs.raise_if_any()
    raise AssertionError("unreachable")


def gunzipped(raw: bytes, errs: Collector, fix: str) -> bytes:
    try:
        return gunzip(raw, MAX_TRACE_BYTES)
    except TreeError as e:
        errs.add("", str(e), fix)
        errs.raise_if_any()
    raise AssertionError("unreachable")


def _squash(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def device_mismatch(backend: str, names: list, base: Any) -> str | None:
    """Why measurements taken on `backend` ("cpu", "cuda", "mlu", or "" when unknown) on devices
    named `names` do not belong to the base preset `base` (a Device); None when they may.

    >>> from simtrain.hardware.devices import get_device
    >>> h100 = get_device("h100-sxm5-80gb")
    >>> device_mismatch("cuda", ["NVIDIA H100 80GB HBM3"], h100) is None
    True
    >>> device_mismatch("cpu", ["x86_64"], h100)
    'the CPU (x86_64)'
    >>> device_mismatch("cuda", ["NVIDIA A100-SXM4-80GB"], h100)
    'NVIDIA A100-SXM4-80GB'
    """
    shown = ", ".join(sorted({str(n) for n in names if n})) or "?"
    if backend == "cpu":
        return f"the CPU ({shown})"
    vendor = {"cuda": "NVIDIA", "mlu": "Cambricon"}.get(backend)
    if vendor and vendor.lower() != str(base.vendor).lower():
        return f"{vendor} {shown}"
    model = _squash(base.key.split("-")[0])          # h100, a100, mlu590, ...
    known = [n for n in names if n and str(n) != "?"]
    if known and not any(model in _squash(str(n)) for n in known):
        return shown
    return None
