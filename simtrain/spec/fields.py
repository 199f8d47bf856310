"""Input keys declared once: type, default, unit, allowed values and doc of every YAML key.

A `Key` declares one key of an input file; a `Section` is an ordered mapping of them. The frozen
spec dataclasses declare theirs on the fields (`spec_field`), so a field's type, default and doc
sit in one place, and `section_of(cls)` reads them back. From a section simtrain derives:

  validation     `validate_map` / `parse_value`: every problem of a file collected with its key
                 path, `<file>: <key.path>: <problem>; <fix>`, unknown keys with a "did you mean";
                 `validate_tree` checks a whole tree, lists of entries included
  resolved dump  `dump(obj, section)`: the spec in the YAML layout with every default filled in
  key reference  `markdown_table(sections)`: one row per key path
  JSON Schema    `json_schema(section)`: for editors and CI (draft 2020-12)

Kinds: the unit parsers of `simtrain.units` (bandwidth, time, bytes, flops: strings with a unit,
parsed to SI), int, posint, float, positive (a finite number > 0), bool, str, any, a tuple of allowed values, and "map" (a nested
section, checked recursively). `optional=True` lets a value be null (absent stays None).

Validation also accepts the older `(kind, required, default)` tuples of a table, with "kind?" for
an optional value and `("map", required, table)` for a nested one.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional

from simtrain.errors import Collector
from simtrain.spec.files import short
from simtrain.units import EXAMPLES, PARSERS, UnitError


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

UNIT_KINDS = {"bandwidth": "B/s", "time": "s", "bytes": "B", "flops": "FLOP/s", "duration": "s"}
# what a string with a unit looks like (simtrain.units), for JSON Schema
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
UNIT_PATTERNS = {
    "bandwidth": rf"^\s*{_NUM}\s*(?:Ki|Mi|Gi|Ti|k|K|M|G|T)?[Bb](?:/s|ps)\s*$",
    "time": rf"^\s*{_NUM}\s*(?:s|ms|us|µs|ns|min|h)\s*$",
    "bytes": rf"^\s*{_NUM}\s*(?:Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?[Bb]\s*$",
    "flops": rf"^\s*{_NUM}\s*(?:k|K|M|G|T|P)?FLOP/s\s*$",
    "duration": rf"^\s*{_NUM}\s*(?:s|ms|us|µs|ns|min|h|d|day|days)\s*$",
}


@dataclass(frozen=True)
class Key:
    """One key of an input file.

    kind      how the value is read (see the module docstring)
    default   what an absent key means; REQUIRED: it must be given
    doc       one line for the key reference
    unit      the unit of a plain number (unit kinds name theirs)
    optional  null is allowed (and an absent key stays None)
    section   the keys of a nested mapping (kind "map"), of each entry of a list (`many=True`), or
              of a mapping that the loader reads itself (kind "any"); a dataclass stands for its
              `section_of`
    many      the value is a list of `section` entries
    named     the value maps names to `section` entries (null or false: no entry of that name)
    json      the JSON Schema of the value where the kind does not say enough
    loader    False: read by the loader before the table check (preset names, file references);
              listed in the reference and the JSON Schema, not in the table
    derived   how an absent value is filled in, when it is not a plain default
    dump      "always", "none" (left out when None), "falsy" (left out when empty, None or 0)
    dump_if   the key is dumped only where dump_if(owner) holds
    choices   the allowed values, read from a later stage's registry when first needed, for the
              reference and the JSON Schema (the loader checks them with its own message)
    name      the YAML key, when it differs from the dataclass field
    attr      where the dump reads the value: a field name, or an index into a tuple entry
    minimum   the smallest value allowed (numbers; a unit kind in SI), checked and in the JSON Schema
    maximum   the largest value allowed (likewise)
    example   a typical value, the error's "write e.g." for a wrong one (else the kind's example)
    range_fix the fix an out-of-range value's error gives, where "use a value <= maximum" would
              mislead (a bound a later rule tightens, e.g. by the device)
    dumper    how the resolved dump writes the value, where the plain value would not load again
              (a size in SI bytes is written back with its unit)

    A kind may also be a function returning the tuple of allowed values (a registry read late).
    """
    kind: Any
    default: Any = REQUIRED
    doc: str = ""
    unit: str = ""
    optional: bool = False
    section: Any = None
    many: bool = False
    named: bool = False
    json: Optional[dict] = None
    loader: bool = True
    derived: str = ""
    dump: str = "always"
    dump_if: Optional[Callable] = None
    choices: Optional[Callable] = None
    name: str = ""
    attr: Any = None
    minimum: Any = None
    maximum: Any = None
    range_fix: str = ""
    example: str = ""
    dumper: Optional[Callable] = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def kind_value(self) -> Any:
        """The kind, with a late registry read into its tuple of allowed values."""
        return self.kind() if callable(self.kind) else self.kind

    def allowed(self) -> Optional[tuple]:
        k = self.kind_value()
        if isinstance(k, tuple):
            return k
        return tuple(self.choices()) if self.choices is not None else None

    def entries(self) -> Optional["Section"]:
        s = self.section
        if s is None or isinstance(s, Section):
            return s
        if isinstance(s, dict):
            return Section({k: as_key(v) for k, v in s.items()})
        return section_of(s)

    def as_tuple(self) -> tuple:
        """The (kind, required, default) form `validate_map` reads."""
        if self.kind == "map":
            return ("map", self.required, table(self.entries()))
        kind = self.kind_value()
        kind = f"{kind}?" if self.optional and isinstance(kind, str) else kind
        return (kind, self.required, None if self.required else self.default)


class Section:
    """Ordered keys of one mapping. `doc` heads its part of the key reference; `notes` accepts
    keys that are not declared (free-text notes such as `*_source`); `open` lets the JSON Schema
    accept undeclared keys (files written by a tool that adds its own); `required` False leaves the
    required keys out of the JSON Schema (a preset may supply them)."""

    def __init__(self, keys: dict, doc: str = "", required: bool = True, notes: Optional[Callable[[str], bool]] = None,
                 open: bool = False):
        self.keys = {k: as_key(v) for k, v in keys.items()}
        self.doc = doc
        self.required = required
        self.notes = notes
        self.open = open
        self._fixed: Optional[dict] = None

    def __iter__(self):
        return iter(self.keys)

    def items(self) -> Any:
        return self.keys.items()

    def __getitem__(self, k: str) -> Key:
        return self.keys[k]

    def __contains__(self, k) -> bool:
        return k in self.keys

    def table(self) -> dict:
        """The `{key: (kind, required, default)}` table of the keys the loader checks. Built once
        per Section (the loader checks every plan of a search against the same sections); kinds
        read from a registry, and nested maps, are resolved on each call, so a backend or schedule
        registered later is accepted."""
        if self._fixed is None:
            self._fixed = {k: key if (callable(key.kind) or key.kind == "map") else key.as_tuple()
                           for k, key in self.items() if key.loader}
        return {k: v.as_tuple() if isinstance(v, Key) else v for k, v in self._fixed.items()}


def as_key(spec: Key | tuple) -> Key:
    """A Key from a Key or an older `(kind, required, default)` tuple."""
    if isinstance(spec, Key):
        return spec
    kind, required, default = spec
    optional = isinstance(kind, str) and kind.endswith("?")
    if optional:
        kind = kind[:-1]
    if kind == "map":
        return Key("map", REQUIRED if required else {}, section=Section(default))
    return Key(kind, REQUIRED if required else default, optional=optional)


def table(section: Section) -> dict:
    """The `{key: (kind, required, default)}` table of the keys the loader checks."""
    return section.table()


# --- declaring keys on dataclass fields ------------------------------------------------------------

def spec_field(kind: Any, doc: str = "", *, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING,
               yaml_default: Any = dataclasses.MISSING, required: Optional[bool] = None, **key: Any) -> Any:
    """A dataclass field that declares its YAML key.

    `default` / `default_factory` are the spec's default; `yaml_default` what an absent key reads
    as, where that differs (e.g. None for a value the loader derives). `required` defaults to
    "the field has no default"."""
    md = {"kind": kind, "doc": doc, "yaml_default": yaml_default, "required": required, **key}
    kw: dict = {"metadata": {"key": md}}
    if default is not dataclasses.MISSING:
        kw["default"] = default
    if default_factory is not dataclasses.MISSING:
        kw["default_factory"] = default_factory
    return dataclasses.field(**kw)


@lru_cache(maxsize=None)
def section_of(cls: type) -> Section:
    """The Section a spec dataclass declares on its fields (`spec_field`), in field order, after
    the keys of its `_extra_keys` (read by the loader, with no field of their own) and before
    those of its `_keys_after`."""
    keys: dict = dict(getattr(cls, "_extra_keys", {}))
    after: dict = dict(getattr(cls, "_keys_after", {}))
    for f in dataclasses.fields(cls):
        md = f.metadata.get("key")
        if md is None:
            continue
        md = dict(md)
        yaml_default, required = md.pop("yaml_default"), md.pop("required")
        if yaml_default is not dataclasses.MISSING:
            default = yaml_default
        elif f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = None if f.default_factory is not dataclasses.MISSING else REQUIRED
        if required is None:
            required = default is REQUIRED
        if not required and default is REQUIRED:
            default = None
        if required:
            default = REQUIRED
        name = md.pop("name", "") or f.name
        keys[name] = Key(default=default, name=name, attr=f.name, **md)
    keys.update(after)
    doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") else ""
    return Section(keys, doc=getattr(cls, "_doc", doc), required=getattr(cls, "_schema_required", True))


# --- validation ------------------------------------------------------------------------------------

def _unknown_key(key: Any, raw: dict, known: list, required: Callable[[str], bool], path: str, errs: Collector,
                 suggested: set) -> None:
    """The error for an unknown `key` of `raw` with its nearest known key. When that is a required
    key the mapping lacks, the hint says so and it joins `suggested`: the caller then reports no
    separate "missing required key" for the same typo."""
    close = difflib.get_close_matches(str(key), known, n=1)
    if not close:
        hint = f"allowed keys: {', '.join(known)}"
    elif required(close[0]) and close[0] not in raw:
        hint = f"did you mean `{close[0]}` (a required key)?"
        suggested.add(close[0])
    else:
        hint = f"did you mean `{close[0]}`?"
    errs.add(_join(path, key), "unknown key", hint)


def validate_map(raw: Any, schema: Section | dict, path: str, errs: Collector) -> dict:
    """Checks a YAML mapping against a Section (or a `(kind, required, default)` table); returns the
    parsed values of the keys the loader checks.

    Unknown keys, missing required keys, wrong types and bare numbers where a unit is needed are
    all collected into `errs` rather than raised one at a time.
    """
    if not isinstance(schema, Section):
        schema = Section(schema)
    notes = schema.notes
    keys = schema.keys
    schema = schema.table()
    out: dict = {}
    if not isinstance(raw, dict):
        errs.add(path or "<top>", f"expected a mapping, got {type(raw).__name__}", "write it as `key: value` lines")
        return out
    suggested = set()     # required keys an unknown key was taken for: its error already says so
    for key in raw:
        if key not in schema and not (notes and notes(key)):
            _unknown_key(key, raw, list(schema), lambda k: schema[k][1], path, errs, suggested)
    for key, (kind, required, default) in schema.items():
        p = _join(path, key)
        if key not in raw:
            if required:
                # a check before this one may have said why the key is missing, and how to give it
                if key not in suggested and not any(q.path == p for q in errs.problems):
                    errs.add(p, "missing required key", f"add `{key}:`" + (f" (a {kind}, e.g. {EXAMPLES[kind]})" if kind in EXAMPLES else ""))
                continue
            if kind == "map":
                out[key] = validate_map({}, keys[key].entries() or default, p, errs)
                continue
            value = default
        else:
            value = raw[key]
        if kind == "map":
            out[key] = validate_map(value, keys[key].entries() or default, p, errs)
        else:
            out[key] = check_range(parse_value(value, kind, p, errs, keys[key].example), keys[key], p, errs)
    return out


def check_range(value: Any, key: Key, path: str, errs: Collector) -> Any:
    """The value, or None (with a problem in errs) when it lies outside the key's declared
    minimum / maximum."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    lo, hi = key.minimum, key.maximum
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        errs.add(path, f"{short(value, 60)} is out of range", key.range_fix or f"use a value {range_text(key)}")
        return None
    return value


def _num(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def range_text(key: Key) -> str:
    """`>= 1 and <= 10,000` for a key's declared range (units in SI)."""
    unit = key.unit or (UNIT_KINDS.get(key.kind, "") if isinstance(key.kind, str) else "")
    unit = f" {unit}" if unit and key.kind in UNIT_KINDS else ""
    parts = ([f">= {_num(key.minimum)}{unit}"] if key.minimum is not None else []) + \
        ([f"<= {_num(key.maximum)}{unit}"] if key.maximum is not None else [])
    return " and ".join(parts)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def validate_tree(raw: Any, section: Section, path: str, errs: Collector) -> None:
    """Checks a whole YAML tree against a Section, nested sections and lists of entries included
    (where `validate_map` leaves kind "any" to the loader): unknown keys (unless the section is
    `open`), missing required keys, values of the wrong kind, and required lists that are empty.
    Every problem goes to `errs` at its key path, e.g. `gemm[0].points[2].tflops`."""
    if not isinstance(raw, dict):
        errs.add(path or "<top>", f"expected a mapping, got {type(raw).__name__}", "write it as `key: value` lines")
        return
    suggested = set()     # required keys an unknown key was taken for: its error already says so
    if not section.open:
        known = list(section)
        for key in raw:
            if key not in section and not (section.notes and section.notes(key)):
                _unknown_key(key, raw, known, lambda k: section[k].required, path, errs, suggested)
    for name, key in section.items():
        p = _join(path, name)
        value = raw.get(name)
        if name not in raw or value is None:
            if key.required and name not in suggested:
                errs.add(p, "missing required key", f"add `{name}:`")
            continue
        sub = key.entries()
        if key.many:
            if not isinstance(value, list):
                errs.add(p, f"expected a list, got {type(value).__name__}", "write it as a list of `- key: value` entries")
            elif not value and key.required:
                errs.add(p, "empty", "give at least one entry")
            else:
                for i, entry in enumerate(value):
                    validate_tree(entry, sub, f"{p}[{i}]", errs)
        elif key.named and isinstance(value, dict):
            for n, entry in value.items():
                if entry is not None and entry is not False:
                    validate_tree(entry, sub, _join(p, n), errs)
        elif sub is not None:
            validate_tree(value, sub, p, errs)
        else:
            check_range(parse_value(value, key.as_tuple()[0], p, errs), key, p, errs)


# whole numbers beyond this are no count of anything simulated (and lose precision as floats)
MAX_INT = 2**53


def integral(value: Any) -> Any:
    """A finite float with no fraction within +-2^53 as the int it is (`8e0`, `1e3`: YAML reads a
    whole number written with an exponent as a float); anything else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) <= MAX_INT:
        return int(value)
    return value


# scientific notation that YAML 1.1 leaves as a string: 1e6, 2.5E-3, -4e+2 (not nan, not inf)
_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d{1,3}$")


def parse_value(value: Any, kind: Any, path: str, errs: Collector, example: str = "") -> Any:
    """One value of a kind; a problem is added to `errs` and the result is None. `example`: a
    typical value of the key, for the error's fix (else the kind's)."""
    if isinstance(kind, str) and kind.endswith("?"):
        # optional value: absent (None) stays None
        return None if value is None else parse_value(value, kind[:-1], path, errs, example)
    if kind in PARSERS:
        try:
            return PARSERS[kind](value)
        except UnitError as e:
            errs.add(path, str(e), f"write e.g. {EXAMPLES[kind]}")
            return None
    if kind in ("int", "posint"):
        lo = 1 if kind == "posint" else -MAX_INT
        value = integral(value)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            errs.add(path, f"{short(value, 60)} is out of range", "use a whole number of at most 2^53 = 9,007,199,254,740,992")
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            what = "a whole number >= 1" if kind == "posint" else "a whole number"
            errs.add(path, f"expected {what}, got {short(value, 60)}", f"write e.g. `{example or 8}`")
            return None
        if value > MAX_INT or value < -MAX_INT:
            errs.add(path, f"{short(value, 60)} is out of range", "use a whole number of at most 2^53 = 9,007,199,254,740,992")
            return None
        return value
    if kind in ("float", "positive"):
        if isinstance(value, str) and _EXPONENT.match(value.strip()):
            # YAML 1.1 reads `1e6` (no dot, no sign in the exponent) as a string; it is a number
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errs.add(path, f"expected a number{' > 0' if kind == 'positive' else ''}, got {short(value, 60)}",
                     f"write e.g. `{'1.5' if kind == 'positive' else '0.8'}`")
            return None
        if (isinstance(value, int) and abs(value) > MAX_INT) or not math.isfinite(value):
            errs.add(path, f"expected a finite number, got {short(value, 60)}", "write a finite number, e.g. `1.5`")
            return None
        if kind == "positive" and value <= 0:
            errs.add(path, f"expected a number > 0, got {short(value, 60)}", "write e.g. `1.5`")
            return None
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            errs.add(path, f"expected true or false, got {short(value, 60)}", "write `true` or `false`")
            return None
        return value
    if kind == "str":
        if not isinstance(value, str):
            errs.add(path, f"expected text, got {short(value, 60)}", "write it as a string")
            return None
        return value
    if isinstance(kind, tuple):  # choices; a bool is not the number 1 or 0
        bad = isinstance(value, bool) and not any(isinstance(c, bool) for c in kind)
        try:
            bad = bad or value not in kind
        except TypeError:       # unhashable
            bad = True
        if bad:
            # the problem lists the choices; the fix names the nearest one, if any
            fix = "use one of those"
            near = difflib.get_close_matches(value, [str(c) for c in kind], 1, 0.75) if isinstance(value, str) else []
            if near:
                fix = f"did you mean {near[0]}?"
            elif isinstance(value, bool):
                # YAML 1.1 reads off / no / on / yes as booleans: say so, and quote a word that is meant
                off = "none" if "none" in kind else None
                words = "on, yes and true" if value else "off, no and false"
                fix = (f"YAML reads {words} as {str(value).lower()}; write one of the words"
                       + (f" (e.g. {off})" if off and value is False else ""))
            errs.add(path, f"{short(value, 60)} is not one of {', '.join(map(str, kind))}", fix)
            return None
        return value
    if kind == "any":
        return value
    raise ValueError(f"schema kind {kind!r}")


# --- resolved dump ---------------------------------------------------------------------------------

def dump(obj: Any, section: Section) -> dict:
    """A spec (dataclass, or tuple entry) as its YAML mapping: every declared key with its value,
    nested sections dumped in turn, tuples as lists; keys with a dump policy left out as declared."""
    out = {}
    for name, key in section.items():
        if key.attr is None:
            continue
        if key.dump_if is not None and not key.dump_if(obj):
            continue
        v = obj[key.attr] if isinstance(key.attr, int) else getattr(obj, key.attr)
        if (key.dump == "none" and v is None) or (key.dump == "falsy" and not v):
            continue
        out[name] = _plain(v, key)
    return out


def _plain(v, key: Key):
    if key.dumper is not None and v is not None:
        return key.dumper(v)
    sub = key.entries()
    if sub is not None and v is not None and not isinstance(v, (str, int, float)):
        if key.many:
            return [dump(e, sub) for e in v]
        if dataclasses.is_dataclass(v):
            return dump(v, sub)
    if isinstance(v, (tuple, list)):
        return [_plain(x, Key("any")) for x in v]
    if dataclasses.is_dataclass(v):
        return dataclasses.asdict(v)
    return v


# --- JSON Schema -----------------------------------------------------------------------------------

def value_schema(key: Key) -> dict:
    """The JSON Schema of one key's value."""
    sub = key.entries()
    kind = key.kind_value()
    allowed = key.allowed()
    if key.json is not None:
        s = dict(key.json)
    elif sub is not None and kind in ("map", "any"):
        obj = object_schema(sub)
        if key.many:
            s = {"type": "array", "items": obj, **({"minItems": 1} if key.required else {})}
        elif key.named:
            s = {"type": "object", "additionalProperties": {"anyOf": [obj, {"enum": [None, False]}]}}
        else:
            s = obj
    elif kind in UNIT_PATTERNS:
        s = {"type": "string", "pattern": UNIT_PATTERNS[kind], "examples": [x.strip('"') for x in EXAMPLES[kind].split(" or ")]}
    elif kind == "int":
        s = {"type": "integer"}
    elif kind == "posint":
        s = {"type": "integer", "minimum": 1}
    elif kind == "float":
        s = {"type": "number"}
    elif kind == "positive":
        s = {"type": "number", "exclusiveMinimum": 0}
    elif kind == "bool":
        s = {"type": "boolean"}
    elif allowed is not None:
        s = {"enum": list(allowed)}
    elif kind == "str":
        s = {"type": "string"}
    else:
        s = {}
    if s.get("type") in ("integer", "number"):
        if key.minimum is not None:
            if key.minimum > 0:
                s.pop("exclusiveMinimum", None)
            s["minimum"] = max(key.minimum, s.get("minimum", key.minimum))
        if key.maximum is not None:
            s["maximum"] = key.maximum
    if key.optional and s:
        s = {"anyOf": [s, {"type": "null"}]}
    desc = key.doc
    if key.kind_value() in UNIT_KINDS and (key.minimum is not None or key.maximum is not None):
        desc = f"{desc} ({range_text(key)})".strip()
    if key.unit or kind in UNIT_KINDS:
        desc = f"{desc} [{key.unit or UNIT_KINDS[kind]}]".strip()
    if key.derived:
        desc = f"{desc} (absent: {key.derived})".strip()
    if desc:
        s["description"] = desc
    if not key.required and key.default is not None and not isinstance(key.default, (dict, Section)) and not key.derived:
        s["default"] = list(key.default) if isinstance(key.default, tuple) else key.default
    return s


def object_schema(section: Section) -> dict:
    props = {name: value_schema(key) for name, key in section.items()}
    s: dict = {"type": "object"}
    if section.doc:
        s["description"] = section.doc
    s["properties"] = props
    req = [n for n, k in section.items() if k.required] if section.required else []
    if req:
        s["required"] = req
    if section.notes is not None:
        s["patternProperties"] = {"(source|reasoning)$": {}}
    s["additionalProperties"] = section.open
    return s


def json_schema(section: Section, title: str, id_: str) -> dict:
    """A whole-file JSON Schema (draft 2020-12) of a section."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": id_, "title": title, **object_schema(section)}


# --- key reference ---------------------------------------------------------------------------------

def _type_text(key: Key) -> str:
    k = key.kind_value()
    allowed = key.allowed()
    if key.many:
        t = "list of mappings"
    elif key.named:
        t = "mapping of names to mappings"
    elif allowed is not None:
        t = " \\| ".join(f"`{x}`" for x in allowed)
    elif k in UNIT_KINDS:
        t = f"{k} (string with unit, e.g. {EXAMPLES[k].split(' or ')[0]})"
    elif k == "map" or (key.section is not None and k == "any" and key.json is None):
        t = "mapping"
    elif key.json is not None and "description" in key.json:
        t = key.json["description"]
    else:
        t = {"posint": "whole number >= 1", "int": "whole number", "float": "number", "positive": "number > 0", "bool": "true \\| false",
             "str": "text", "any": "any"}.get(k, str(k))
    if key.minimum is not None or key.maximum is not None:
        t += f" ({range_text(key)})"
    return t + (" or null" if key.optional else "")


def _default_text(key: Key) -> str:
    if key.required:
        return "**required**"
    if key.derived:
        return key.derived
    d = key.default
    if d is None or isinstance(d, (dict, Section)):
        return "—"
    if isinstance(d, bool):
        return f"`{str(d).lower()}`"
    if isinstance(d, str):
        return f'`"{d}"`' if d == "" or any(c in d for c in " /") else f"`{d}`"
    return f"`{d}`"


def rows(section: Section, prefix: str = "") -> list[tuple]:
    """(key path, type, default, unit, doc) for every key, nested sections after their key."""
    out = []
    for name, key in section.items():
        p = f"{prefix}.{name}" if prefix else name
        if key.many:
            p += "[]"
        unit = key.unit or (UNIT_KINDS.get(key.kind, "") if isinstance(key.kind, str) else "")
        out.append((p, _type_text(key), _default_text(key), unit, key.doc))
        sub = key.entries()
        if sub is not None:
            out.extend(rows(sub, p + ".<name>" if key.named else p))
    return out


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ") if "\\|" not in str(s) else str(s)


def markdown_table(section: Section, prefix: str = "") -> str:
    """A Markdown table of every key of a section."""
    lines = ["| key | type | default | unit | description |", "|---|---|---|---|---|"]
    for p, t, d, u, doc in rows(section, prefix):
        lines.append(f"| `{p}` | {_cell(t)} | {_cell(d)} | {_cell(u)} | {_cell(doc)} |")
    return "\n".join(lines) + "\n"

