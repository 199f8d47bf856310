"""Unit parsing: YAML strings with units -> SI floats (seconds, bytes, bytes/s, FLOP/s).

Conventions (DESIGN.md): GB = 1e9 B, GiB = 2**30 B, b = bit, B = byte. A bare number where a
unit is needed is an error that shows the spelled form, e.g. `"300 GB/s"`.

Worked example: "200 Gb/s" -> 200e9 bits/s / 8 = 25e9 B/s; "80 GiB" -> 80 * 2**30 = 85_899_345_920 B.

>>> parse_bandwidth("200 Gb/s")
25000000000.0
>>> parse_bytes("80 GiB")
85899345920.0
>>> parse_time("1.5 ms")
0.0015
"""
from __future__ import annotations

import math
import re

_PREFIX = {
    "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50,
}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"

EXAMPLES = {
    "bandwidth": '"300 GB/s" or "200 Gb/s"',
    "time": '"5 us" or "1.5 ms"',
    "bytes": '"80 GiB" or "40 GB"',
    "flops": '"312 TFLOP/s"',
    "duration": '"90 s" or "30 days"',
}


class UnitError(ValueError):
    pass


# the range of a physical value simtrain accepts (SI): beyond it is a typo, not a machine
LIMITS = {
    "bandwidth": (1e3, 1e21),          # 1 kB/s .. 1 ZB/s
    "time": (0.0, 1e6),                # up to 11.6 days (latencies, overheads)
    "duration": (0.0, 100 * 365 * 86400.0),   # up to 100 years (spans of a long run)
    "bytes": (0.0, 1e21),              # up to 1 ZB
    "flops": (1e3, 1e21),              # 1 kFLOP/s .. 1 ZFLOP/s
}


def _show(value: object) -> str:
    """A value as an error prints it: short, however large (a list is named, not printed)."""
    if isinstance(value, (str, float)) or (isinstance(value, int) and value.bit_length() < 256):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__}"


def _in_range(out: float, value: object, kind: str, what: str) -> float:
    lo, hi = LIMITS[kind]
    if not (math.isfinite(out) and lo <= out <= hi):
        bound = f"> 0 (at least {lo:g} and at most {hi:g} {_SI[kind]})" if lo > 0 else f">= 0 (at most {hi:g} {_SI[kind]})"
        raise UnitError(f"{_show(value)}: {what} must be finite and {bound}")
    return out


_SI = {"bandwidth": "B/s", "time": "s", "duration": "s", "bytes": "B", "flops": "FLOP/s"}


def _split(text: str):
    if len(text) > 100:
        raise UnitError(f"{text[:40]!r}... is too long to be a number with a unit")
    m = re.fullmatch(r"\s*" + _NUM + r"\s*([A-Za-zµ/]+)\s*", text)
    if not m:
        raise UnitError(f"cannot read {text!r} as a number with a unit")
    return float(m.group(1)), m.group(2)


def _need_str(value, kind):
    if isinstance(value, bool) or not isinstance(value, str):
        raise UnitError(f"{_show(value)} has no unit; write it as a string with a unit, e.g. {EXAMPLES[kind]}")
    return value


def parse_bytes(value: object) -> float:
    num, unit = _split(_need_str(value, "bytes"))
    m = re.fullmatch(r"(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P|)(B|b)", unit)
    if not m:
        raise UnitError(f"unknown size unit {unit!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB (b = bit)")
    scale = _PREFIX[m.group(1)] * (1.0 if m.group(2) == "B" else 0.125)
    return _in_range(num * scale, value, "bytes", "a size")


def parse_bandwidth(value: object) -> float:
    num, unit = _split(_need_str(value, "bandwidth"))
    m = re.fullmatch(r"(Ki|Mi|Gi|Ti|k|K|M|G|T|)(B|b)(?:/s|ps)", unit)
    if not m:
        raise UnitError(f"unknown bandwidth unit {unit!r}; use e.g. GB/s (bytes) or Gb/s (bits)")
    scale = _PREFIX[m.group(1)] * (1.0 if m.group(2) == "B" else 0.125)
    return _in_range(num * scale, value, "bandwidth", "a bandwidth")


def parse_time(value: object) -> float:
    num, unit = _split(_need_str(value, "time"))
    if unit not in _TIME:
        raise UnitError(f"unknown time unit {unit!r}; use s, ms, us or ns")
    return _in_range(num * _TIME[unit], value, "time", "a time")


def parse_flops(value: object) -> float:
    num, unit = _split(_need_str(value, "flops"))
    m = re.fullmatch(r"(k|K|M|G|T|P|)FLOP/s", unit)
    if not m:
        raise UnitError(f"unknown throughput unit {unit!r}; use e.g. TFLOP/s")
    return _in_range(num * _PREFIX[m.group(1)], value, "flops", "a throughput")


def parse_duration(value: object) -> float:
    """parse_time plus days (`d`, `day`, `days`), for the spans of a long run.

    >>> parse_duration("30 days")
    2592000.0
    >>> parse_duration("90 s")
    90.0
    """
    if isinstance(value, str):
        m = re.fullmatch(r"\s*" + _NUM + r"\s*(d|day|days)\s*", value)
        if m:
            return _in_range(float(m.group(1)) * 86400.0, value, "duration", "a time")
    num, unit = _split(_need_str(value, "duration"))
    if unit not in _TIME:
        raise UnitError(f"unknown time unit {unit!r}; use s, ms, us, ns, min, h or days")
    return _in_range(num * _TIME[unit], value, "duration", "a time")


PARSERS = {"bandwidth": parse_bandwidth, "time": parse_time, "bytes": parse_bytes, "flops": parse_flops,
           "duration": parse_duration}


def fmt_time(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def fmt_size(n: float) -> str:
    """Bytes in the largest binary unit they reach: 1536 -> '1.50 KiB', 100 -> '100 B'."""
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n:.0f} B"


def plural(n: int | float, noun: str, many: str | None = None) -> str:
    """`n` and the noun, singular for exactly one: "1 trial", "3 trials", "2,048 hosts"."""
    word = noun if n == 1 else (many or noun + "s")
    return f"{n:,} {word}" if isinstance(n, int) else f"{n:g} {word}"
