"""The syntax of `--set` / `--grid` arguments, shared by every command (one parser, one meaning).

    key.path=value              one value (parsed as YAML: `8`, `true`, `"300 GB/s"`, `[7, 8]`)
    key.path=v1,v2,v3           an axis of several values (commas inside [..] / {..} belong to a
                                list or mapping value); `compare` and `sweep` run one variant per
                                value, several axes give their cartesian product, first slowest
    a.x+b.y=1+2,3+4             keys joined by `+` move together (one zipped axis): each value
                                joins one value per key with `+`; here (a.x=1, b.y=2), (a.x=3, b.y=4)

A command that runs one scenario (run, check, schedule, search, reliability, bench --for) takes
one value per key; `a+b=1+2` sets both keys there too.

>>> split_values("1f1b,zb_v, [1,3,3,1] ,x")
['1f1b', 'zb_v', '[1,3,3,1]', 'x']
>>> [a.values for a in parse_axes(["n+d=32+8,64+16", "tp=4"], "--set")[1]]
[[['n=32', 'd=8'], ['n=64', 'd=16']]]
>>> parse_axes(["n+d=32+8", "tp=4"], "--set")[0]
['n=32', 'd=8', 'tp=4']
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from simtrain.errors import Collector


def _split_outside_brackets(text: str, sep: str) -> list:
    """`text` split on the character `sep` where it is outside [...] and {...}, each part stripped."""
    out, cur, depth = [], "", 0
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [v.strip() for v in out]


def split_values(text: str) -> list:
    """'a,b,[1,2],c' -> ['a', 'b', '[1,2]', 'c'] (commas inside brackets stay)."""
    return _split_outside_brackets(text, ",")


def _split_plus(value: str) -> list:
    """'32+[1,2]+x' -> ['32', '[1,2]', 'x'] (`+` inside brackets stays)."""
    return _split_outside_brackets(value, "+")


@dataclass
class Axis:
    """One axis: its keys (several when `+`-joined) and, per value, the overrides it sets."""
    keys: list
    values: list          # one list of `key=value` strings per value of the axis

    def label(self, i: int) -> str:
        """`key=value` of the axis' i-th value (all its keys)."""
        return " ".join(self.values[i])


def expand(arg: str, source: str, errs: Collector) -> tuple[list, list] | None:
    """One argument -> (keys, [overrides per value]); None (with the problem in `errs`) when malformed."""
    key, eq, val = arg.partition("=")
    keys = [k.strip() for k in key.split("+")]
    if not eq or not all(keys):
        errs.add(f"{source} {arg[:100]}", "expected key.path=value (or key.path=v1,v2,... for an axis)",
                 f"write e.g. `{source} parallel.tp=4` or `{source} parallel.tp=4,8`")
        return None
    vals = split_values(val) if len(split_values(val)) > 1 else [val]
    if len(keys) == 1:
        return keys, [[f"{keys[0]}={v}"] for v in vals]
    out = []
    for v in vals:
        parts = _split_plus(v)
        if len(parts) != len(keys):
            errs.add(f"{source} {key.strip()[:100]}", f"value {v!r} has {len(parts)} parts for {len(keys)} keys",
                     f"join exactly {len(keys)} values with `+`, e.g. `{key.strip()}={'+'.join(['1'] * len(keys))}`")
            return None
        out.append([f"{k}={x}" for k, x in zip(keys, parts)])
    return keys, out


def parse_axes(args: Sequence[str] | None, source: str = "--set", always_axis: bool = False) -> tuple[list, list]:
    """Arguments -> (fixed overrides, axes). An argument with one value is fixed unless
    `always_axis` (sweep's --grid: every argument is an axis, even of one value). Raises a
    ConfigError naming every malformed argument."""
    fixed, axes = [], []
    errs = Collector(source)
    for a in args or ():
        got = expand(a, source, errs)
        if got is None:
            continue
        keys, vals = got
        if len(vals) > 1 or always_axis:
            axes.append(Axis(keys, vals))
        else:
            fixed += vals[0]
    errs.raise_if_any()
    return fixed, axes


def product(fixed: Sequence[str], axes: Sequence[Axis]) -> list:
    """(labels, overrides) of every point: the cartesian product of the axes, first slowest; the
    label names the varied keys' values, e.g. `parallel.tp=4 parallel.pp=2`."""
    out = []
    for combo in itertools.product(*[range(len(a.values)) for a in axes]):
        label = " ".join(a.label(i) for a, i in zip(axes, combo))
        out.append((label, list(fixed) + [o for a, i in zip(axes, combo) for o in a.values[i]]))
    return out


def expand_single(overrides: Sequence[str] | None, errs: Collector) -> list:
    """The overrides of a single-scenario command with `+`-joined keys split (`a+b=1+2` -> a=1, b=2;
    a wrong count of parts goes to `errs`); other arguments unchanged (the loader reports malformed
    ones with their key)."""
    out = []
    for ov in overrides or ():
        key, eq, val = ov.partition("=")
        keys = [k.strip() for k in key.split("+")]
        if not eq or len(keys) == 1:
            out.append(ov)
            continue
        parts = _split_plus(val)
        if len(parts) != len(keys) or not all(keys):
            errs.add(f"--set {key.strip()[:100]}", f"value {val[:60]!r} has {len(parts)} parts for {len(keys)} keys",
                     f"join exactly {len(keys)} values with `+`, e.g. `{key.strip()[:100]}={'+'.join(['1'] * len(keys))}`")
            continue
        out += [f"{k}={x}" for k, x in zip(keys, parts)]
    return out
