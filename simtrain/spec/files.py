"""Reading input files safely: YAML and JSON trees of bounded size, with no duplicate keys.

Every file simtrain reads (scenario, topology, device profile, Hugging Face config.json, `--set`
values) goes through here, so each refusal reads the same `<file>: <problem>; <fix>`:

  - only a regular file of at most MAX_FILE_BYTES is read (not /dev/zero, a FIFO, a directory);
  - a mapping that repeats a key is refused (YAML and JSON would keep the last one silently);
  - a tree nested deeper than MAX_DEPTH, or holding more than MAX_NODES values (a YAML anchor
    "bomb" expands a few lines into billions), is refused before anything walks it;
  - a number too long to read (Python refuses integers of more than 4,300 digits) is refused.
"""
from __future__ import annotations

import json
import os
import re
import stat
import zlib
from pathlib import Path
from typing import Any

import yaml

from simtrain.errors import Collector

MAX_FILE_BYTES = 16 * 2**20
MAX_DEPTH = 64
MAX_NODES = 1_000_000


class TreeError(ValueError):
    """The text is not a tree simtrain reads; the message says why and how to fix it."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping repeating a key."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for k, _ in node.value:
            key = self.construct_object(k, deep=True)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:
                continue        # an unhashable key: SafeLoader reports it
            if dup:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {short(key, 60)} (line {k.start_mark.line + 1})", k.start_mark)
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _UniqueKeyLoader.construct_mapping)

# YAML 1.1 (PyYAML) reads a float only with a dot, so `5e-6` and `1e9` would arrive as strings and be
# refused as "not a number"; YAML 1.2 and JSON read them as floats, and so does simtrain. The
# resolver is the loader's own (PyYAML copies the table per class), so yaml.safe_load is unchanged.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def short(value: Any, limit: int = 200) -> str:
    """repr of a value cut to `limit` characters, cheap however large the value (an error message
    never prints a whole expanded tree)."""
    if isinstance(value, (list, tuple, dict, set)):
        text = _Repr().repr(value)
    elif isinstance(value, int) and value.bit_length() > 256:
        text = f"<a whole number of {value.bit_length()} bits>"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Repr:
    """A bounded repr: at most 12 entries per container, 4 levels deep."""

    def repr(self, v: Any, level: int = 0) -> str:
        if isinstance(v, (list, tuple, set)):
            if level >= 4:
                return "[...]"
            items = list(v)[:12] if not isinstance(v, set) else sorted(map(str, v))[:12]
            body = ", ".join(self.repr(x, level + 1) for x in items)
            return f"[{body}{', ...' if len(v) > 12 else ''}]"
        if isinstance(v, dict):
            if level >= 4:
                return "{...}"
            body = ", ".join(f"{self.repr(k, level + 1)}: {self.repr(x, level + 1)}" for k, x in list(v.items())[:12])
            return "{" + body + (", ..." if len(v) > 12 else "") + "}"
        return short(v, 60)


def check_tree(tree: Any) -> None:
    """Raises TreeError when the tree nests deeper than MAX_DEPTH or holds more than MAX_NODES
    values (shared subtrees, as YAML aliases make, counted each time they appear)."""
    total = 0
    sizes: dict = {}        # id -> (values below, depth below), for shared subtrees
    stack = [(tree, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if depth > MAX_DEPTH:
            raise TreeError(f"nested more than {MAX_DEPTH} levels deep")
        if not isinstance(node, (list, dict)):
            continue
        kids = list(node.values()) if isinstance(node, dict) else node
        if not done:
            if id(node) in sizes:
                n, d = sizes[id(node)]
                total += n
                if depth + d > MAX_DEPTH:
                    raise TreeError(f"nested more than {MAX_DEPTH} levels deep")
                if total > MAX_NODES:
                    raise TreeError(f"holds more than {MAX_NODES:,} values (YAML aliases expanded)")
                continue
            stack.append((node, depth, True))
            stack.extend((k, depth + 1, False) for k in kids if isinstance(k, (list, dict)))
            total += len(kids)
            if total > MAX_NODES:
                raise TreeError(f"holds more than {MAX_NODES:,} values (YAML aliases expanded)")
        else:
            n = len(kids) + sum(sizes.get(id(k), (0, 0))[0] for k in kids if isinstance(k, (list, dict)))
            d = 1 + max((sizes.get(id(k), (0, 0))[1] for k in kids if isinstance(k, (list, dict))), default=0)
            sizes[id(node)] = (n, d)
            if n > MAX_NODES:
                raise TreeError(f"holds more than {MAX_NODES:,} values (YAML aliases expanded)")


def _yaml_syntax(e: yaml.YAMLError) -> str:
    """A YAML syntax error as `not valid YAML at line L, column C: <problem>; <fix>`, from the
    parser's marks (1-based, as editors count) rather than its multi-line text."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if mark is None or not problem:
        return f"not valid YAML ({short(' '.join(str(e).split()), 200)})"
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    ctx, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    opened = f" ({ctx[:60]} opened at line {cmark.line + 1}, column {cmark.column + 1})" if ctx and cmark else ""
    return (f"not valid YAML at {where}: {problem[:120]}{opened}; "
            "fix the syntax there (a bracket, brace or quote left open, or a tab used for indentation)")


def parse_yaml(text: str) -> Any:
    """YAML text -> tree; TreeError on a duplicate key, deep nesting, a huge expansion, a number
    too long to read, or invalid YAML."""
    try:
        tree = yaml.load(text, Loader=_UniqueKeyLoader)
    except RecursionError:
        raise TreeError(f"nested too deep to read (more than {MAX_DEPTH} levels are refused)") from None
    except yaml.constructor.ConstructorError as e:
        if e.problem and e.problem.startswith("duplicate key"):
            raise TreeError(f"{e.problem}: YAML would keep only the last value silently; remove one") from None
        raise TreeError(f"not valid YAML ({short(' '.join(str(e).split()), 200)})") from None
    except yaml.YAMLError as e:
        raise TreeError(_yaml_syntax(e)) from None
    except (ValueError, OverflowError) as e:
        raise TreeError(f"a number cannot be read ({short(str(e).split(';')[0], 120)})") from None
    check_tree(tree)
    return tree


def _unique_pairs(pairs: list) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise TreeError(f"duplicate key {short(k, 60)}: JSON would keep only the last value silently; remove one")
        out[k] = v
    return out


def parse_json(text: str) -> Any:
    """JSON text -> tree, under the same rules as parse_yaml."""
    try:
        tree = json.loads(text, object_pairs_hook=_unique_pairs)
    except RecursionError:
        raise TreeError(f"nested too deep to read (more than {MAX_DEPTH} levels are refused)") from None
    except TreeError:
        raise
    except json.JSONDecodeError as e:
        raise TreeError(f"not valid JSON ({short(str(e), 200)})") from None
    except (ValueError, OverflowError) as e:
        raise TreeError(f"a number cannot be read ({short(str(e).split(';')[0], 120)})") from None
    check_tree(tree)
    return tree


def read_bytes(path: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; TreeError otherwise. Nothing is read
    from a device, a FIFO or a directory (opening a FIFO without a writer would block)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise TreeError(f"cannot read the file ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise TreeError("is not a regular file (a device, a FIFO or a directory)")
    if st.st_size > limit:
        raise TreeError(f"is {st.st_size / 2**20:.1f} MiB; input files of at most {limit // 2**20} MiB are read")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise TreeError(f"cannot read the file ({e.strerror})") from None
    if len(data) > limit:
        raise TreeError(f"is over {limit // 2**20} MiB; input files of at most that are read")
    return data


def read_text(path: str | Path) -> str:
    """The text of a regular file of at most MAX_FILE_BYTES; TreeError otherwise."""
    return decode_text(read_bytes(path))


def decode_text(data: bytes) -> str:
    """UTF-8 bytes -> text; TreeError otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TreeError("is not a UTF-8 text file") from None


def gunzip(data: bytes, limit: int) -> bytes:
    """The decompressed bytes of gzip data, refused past `limit` bytes (a few kilobytes of gzip
    can expand to gigabytes) or when the data is not gzip or ends early."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise TreeError(f"is not a readable gzip file ({e})") from None
    if len(out) > limit:
        raise TreeError(f"decompresses to over {limit // 2**20} MiB; traces of at most that are read")
    if not d.eof:
        raise TreeError("is a truncated gzip file (it ends before the end of the compressed stream)")
    return out


def load_yaml(path: str | Path, errs: Collector, fix: str) -> Any:
    """The tree of a YAML file; a problem goes to errs at the file (with `fix`) and is raised."""
    try:
        return parse_yaml(read_text(path))
    except TreeError as e:
        # a problem that names its own fix ("duplicate key ...; remove one") keeps it; the
        # caller's general fix is for the others
        problem, _, own = str(e).partition("; ")
        errs.add("", problem, own or fix)
        errs.raise_if_any()


def load_json(path: str | Path) -> Any:
    """The tree of a JSON file; TreeError says what is wrong."""
    return parse_json(read_text(path))


def json_problem(text: str, e: TreeError, fix: str) -> tuple[str, str]:
    """(problem, fix) for JSON text that parse_json refused: where json cannot parse it, the line,
    column and what json expected ("not valid JSON (line 7, column 2: unterminated string starting
    here)"); otherwise the reason simtrain refuses it (a repeated key, nesting too deep), with that
    reason's own fix where it gives one, else `fix`."""
    try:
        json.loads(text)
    except json.JSONDecodeError as d:
        what = d.msg[:1].lower() + d.msg[1:]
        if what.endswith(" at"):
            what += " this point"
        return f"not valid JSON (line {d.lineno}, column {d.colno}: {what})", fix
    except (ValueError, RecursionError, OverflowError):
        pass
    problem, _, own = str(e).partition("; ")
    return problem, own or fix
