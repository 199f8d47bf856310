"""Schema checking shared by every topology builder (and the scenario loader).

A schema maps each key to (kind, required, default). Kinds: the unit parsers of `simtrain.units`
(bandwidth, time, bytes, ...), int, posint, float, bool, str, any, a tuple of allowed values, a
nested schema ("map"), and "kind?" for an optional value that stays None when absent.
Every problem is collected into a `Collector` with its key path, never raised one at a time.
"""
from __future__ import annotations

from simtrain.errors import Collector
from simtrain.units import EXAMPLES, PARSERS, UnitError


def validate_map(raw, schema: dict, path: str, errs: Collector) -> dict:
    """Checks a YAML mapping against a (kind, required, default) schema; returns parsed values.

    Unknown keys, missing required keys, wrong types and bare numbers where a unit is needed are
    all collected into `errs` rather than raised one at a time.
    """
    import difflib
    out = {}
    if not isinstance(raw, dict):
        errs.add(path or "<top>", f"expected a mapping, got {type(raw).__name__}", "write it as `key: value` lines")
        return out
    for key in raw:
        if key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"allowed keys: {', '.join(schema)}"
            errs.add(_join(path, key), "unknown key", hint)
    for key, (kind, required, default) in schema.items():
        p = _join(path, key)
        if key not in raw:
            if required:
                errs.add(p, "missing required key", f"add `{key}:`" + (f" (a {kind}, e.g. {EXAMPLES[kind]})" if kind in EXAMPLES else ""))
                continue
            if kind == "map":
                out[key] = validate_map({}, default, p, errs)
                continue
            value = default
        else:
            value = raw[key]
        if kind == "map":
            out[key] = validate_map(value, default, p, errs)
        else:
            out[key] = parse_value(value, kind, p, errs)
    return out


def _join(path, key):
    return f"{path}.{key}" if path else str(key)


def parse_value(value, kind, path, errs):
    if isinstance(kind, str) and kind.endswith("?"):
        # optional value: absent (None) stays None
        return None if value is None else parse_value(value, kind[:-1], path, errs)
    if kind in PARSERS:
        try:
            return PARSERS[kind](value)
        except UnitError as e:
            errs.add(path, str(e), f"write e.g. {EXAMPLES[kind]}")
            return None
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            errs.add(path, f"expected a whole number, got {value!r}", "write e.g. `8`")
            return None
        return value
    if kind == "posint":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errs.add(path, f"expected a whole number >= 1, got {value!r}", "write e.g. `8`")
            return None
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errs.add(path, f"expected a number, got {value!r}", "write e.g. `0.8`")
            return None
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            errs.add(path, f"expected true or false, got {value!r}", "write `true` or `false`")
            return None
        return value
    if kind == "str":
        if not isinstance(value, str):
            errs.add(path, f"expected text, got {value!r}", "write it as a string")
            return None
        return value
    if isinstance(kind, tuple):  # choices
        if value not in kind:
            errs.add(path, f"{value!r} is not one of {', '.join(map(str, kind))}", f"use one of {', '.join(map(str, kind))}")
            return None
        return value
    if kind == "any":
        return value
    raise ValueError(f"schema kind {kind!r}")
