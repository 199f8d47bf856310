"""A small reader of bash launch scripts: enough of bash to recover the argument list of the
launch command (``torchrun ... pretrain_gpt.py --tensor-model-parallel-size $TP ...``).

What it evaluates, in order, line by line (backslash-newline continuations joined, comments
dropped):

- ``NAME=value`` and ``export NAME=value``, with ``$V``, ``${V}``, ``${V:-default}``,
  ``${V:=default}``, ``$((arithmetic))`` and quotes;
- arrays: ``NAME=( ... )`` over several lines, ``NAME+=( ... )``, ``"${NAME[@]}"`` (one word per
  element) and unquoted ``${NAME[@]}`` (elements split on blanks, as bash does);
- ``if`` / ``elif`` / ``else`` / ``fi`` whose tests are ``[[ a == b ]]``, ``[ a != b ]``, ``-z``,
  ``-n``, joined by ``||`` / ``&&``; a branch whose test cannot be decided (``-f FILE``) is skipped.

The environment is not consulted: a variable the script never sets expands to the empty string
and is remembered as *unset*, so a value that matters can be reported with its name (values are
given with ``--env NAME=VALUE``). Command substitution ``$(...)`` is never run; its result is unset.
Positional parameters (``$1``) are unset too.
"""
from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

_ASSIGN = re.compile(r"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)


@dataclass
class Word:
    """One word of a command after expansion, with the unset variables it was built from."""
    text: str
    unset: frozenset = field(default_factory=frozenset)


@dataclass
class Script:
    """What the reader found: the launch command's words and the variables at that point."""
    words: list[Word]
    env: dict[str, str]
    notes: list[str]


class ShellError(ValueError):
    """A construct this reader cannot follow (unbalanced quotes, an unclosed array)."""


def logical_lines(text: str) -> list[str]:
    """Lines with backslash-newline joined and comments dropped; a multi-line array stays one line."""
    joined = re.sub(r"\\\r?\n", " ", text)
    out: list[str] = []
    pending = ""
    for raw in joined.splitlines():
        line = _strip_comment(raw).strip()
        if not line:
            continue
        if pending:
            pending += " " + line
            if _paren_depth(pending) <= 0:
                out.append(pending)
                pending = ""
            continue
        m = _ASSIGN.match(line)
        if m and m.group(3).startswith("(") and _paren_depth(m.group(3)) > 0:
            pending = line
            continue
        out.append(line)
    if pending:
        raise ShellError(f"array never closed: {pending[:60]}...")
    return out


def _strip_comment(line: str) -> str:
    q = None
    for i, c in enumerate(line):
        if q:
            if c == q:
                q = None
            elif c == "\\" and q == '"':
                continue
        elif c in "'\"":
            q = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t;(") and not line[max(0, i - 1):i + 1] == "$#":
            return line[:i]
    return line


def _paren_depth(s: str) -> int:
    depth, q = 0, None
    for c in s:
        if q:
            if c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
    return depth


class Shell:
    """Variables and arrays of one script, and the expansion of words against them."""

    def __init__(self, env: dict[str, str] | None = None):
        self.vars: dict[str, str] = dict(env or {})
        self.arrays: dict[str, list[Word]] = {}
        self.taint: dict[str, frozenset] = {}

    # -- expansion -------------------------------------------------------------------------
    def _var(self, name: str, unset: set) -> str:
        if name in self.vars:
            unset.update(self.taint.get(name, ()))
            return self.vars[name]
        if name in self.arrays:
            return " ".join(w.text for w in self.arrays[name])
        unset.add(name)
        return ""

    def _param(self, body: str, unset: set) -> tuple[str, list[Word] | None]:
        """${...}: the value, or the words of an array expanded with [@] / [*]."""
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]", body)
        if m:
            return "", list(self.arrays.get(m.group(1), [Word(self.vars[m.group(1)])] if m.group(1) in self.vars else []))
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]", body)
        if m:
            return str(len(self.arrays.get(m.group(1), []))), None
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(:?[-=+])(.*)", body, re.S)
        if m:
            name, op, default = m.groups()
            have = name in self.vars and (op[0] != ":" or self.vars[name] != "")
            if op.endswith("+"):
                return (self._expand_str(default, unset) if have else ""), None
            if have:
                unset.update(self.taint.get(name, ()))
                return self.vars[name], None
            value = self._expand_str(_unquote(default), unset)
            if op.endswith("="):
                self.vars[name] = value
            return value, None
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+", body):
            return self._var(body, unset), None
        unset.add("${" + body + "}")
        return "", None

    def _expand_str(self, s: str, unset: set) -> str:
        return " ".join(w.text for w in self.words(s, unset, split=False)) if s else ""

    def arith(self, expr: str, unset: set) -> str:
        """$(( expr )): integers, + - * / % and parentheses, variables with or without $."""
        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: self._var(m.group(1), unset) or "0", expr)
        text = re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*)\b", lambda m: self._var(m.group(1), unset) or "0", text)
        try:
            return str(_eval_int(ast.parse(text.strip(), mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
            unset.add(f"$(({expr.strip()}))")
            return ""

    def words(self, s: str, unset: set | None = None, split: bool = True) -> list[Word]:
        """The words of `s` after quote removal and expansion (unquoted expansions split on blanks
        when `split`). Each word carries the unset names it used."""
        out: list[Word] = []
        cur: list[str] = []
        cur_unset: set = set()
        started = False
        i, n = 0, len(s)

        def flush() -> None:
            nonlocal cur, cur_unset, started
            if started:
                out.append(Word("".join(cur), frozenset(cur_unset)))
            cur, cur_unset, started = [], set(), False

        def put(value: str, quoted: bool, u: set) -> None:
            nonlocal started
            if quoted or not split:
                cur.append(value)
                cur_unset.update(u)
                started = True
                return
            parts = value.split()
            if not parts:
                if u and not started and not cur:
                    out.append(Word("", frozenset(u)))   # an unset value stays visible to the caller
                else:
                    cur_unset.update(u)
                return
            if value[:1].isspace():
                flush()
            for k, p in enumerate(parts):
                if k:
                    flush()
                cur.append(p)
                cur_unset.update(u)
                started = True
            if value[-1:].isspace():
                flush()

        def dollar(j: int, quoted: bool) -> int:
            nonlocal started
            u: set = set()
            if s.startswith("$((", j):
                end = _matching(s, j + 1)
                cur.append(self.arith(s[j + 3:end - 1], u))
                j = end + 1
            elif s.startswith("$(", j):
                end = _matching(s, j + 1)
                u.add("$(" + s[j + 2:end] + ")")
                j = end + 1
            elif s.startswith("${", j):
                end = s.find("}", j)
                if end < 0:
                    raise ShellError("unclosed ${")
                value, arr = self._param(s[j + 2:end], u)
                j = end + 1
                if arr is not None:
                    for k, w in enumerate(arr):
                        if quoted or not split:
                            if k:
                                flush()
                            cur.append(w.text)
                            cur_unset.update(w.unset)
                            started = True
                        else:
                            for piece in w.text.split():
                                flush()
                                cur.append(piece)
                                cur_unset.update(w.unset)
                                started = True
                    cur_unset.update(u)
                    return j
                put(value, quoted, u)
                return j
            else:
                m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?]", s[j + 1:])
                if not m:
                    cur.append("$")
                    started = True
                    return j + 1
                name = m.group(0)
                value = self._var(name, u) if name not in "@*#?" else ""
                if name in "@*":
                    u.add("$" + name)
                j = j + 1 + len(name)
                put(value, quoted, u)
                return j
            cur_unset.update(u)
            started = True
            return j

        while i < n:
            c = s[i]
            if c in " \t\n":
                flush()
                i += 1
            elif c == "'":
                end = s.find("'", i + 1)
                if end < 0:
                    raise ShellError("unbalanced single quote")
                cur.append(s[i + 1:end])
                started = True
                i = end + 1
            elif c == '"':
                started = True
                i += 1
                while i < n and s[i] != '"':
                    if s[i] == "\\" and i + 1 < n and s[i + 1] in '"$\\`':
                        cur.append(s[i + 1])
                        i += 2
                    elif s[i] == "$":
                        i = dollar(i, True)
                    else:
                        cur.append(s[i])
                        i += 1
                if i >= n:
                    raise ShellError("unbalanced double quote")
                i += 1
            elif c == "\\" and i + 1 < n:
                cur.append(s[i + 1])
                started = True
                i += 2
            elif c == "$":
                i = dollar(i, False)
            else:
                cur.append(c)
                started = True
                i += 1
        flush()
        if unset is not None:
            for w in out:
                unset.update(w.unset)
        return out

    # -- statements ------------------------------------------------------------------------
    def assign(self, name: str, append: bool, value: str) -> None:
        if value.startswith("(") and value.rstrip().endswith(")"):
            items = self.words(value.strip()[1:-1])
            self.arrays[name] = (self.arrays.get(name, []) if append else []) + items
            self.vars.pop(name, None)
            return
        u: set = set()
        text = self._expand_str(value, u)
        self.vars[name] = (self.vars.get(name, "") + text) if append else text
        self.taint[name] = frozenset(u)
        self.arrays.pop(name, None)

    def test(self, cond: str) -> bool | None:
        """The truth of an `if` condition, or None when it cannot be decided here."""
        cond = cond.strip()
        for op, fn in (("||", any), ("&&", all)):
            parts = _split_top(cond, op)
            if len(parts) > 1:
                vals = [self.test(p) for p in parts]
                if None in vals:
                    return None
                return fn(vals)
        neg = False
        if cond.startswith("! "):
            neg, cond = True, cond[2:].strip()
        m = re.fullmatch(r"\[\[\s*(.*?)\s*\]\]|\[\s+(.*?)\s+\]", cond, re.S)
        if not m:
            return None
        w = [x.text for x in self.words(m.group(1) or m.group(2) or "", split=False)]
        if w and w[0] == "!":
            neg, w = not neg, w[1:]
        r: bool | None
        if len(w) == 3 and w[1] in ("==", "=", "!="):
            r = (w[0] == w[2]) if w[1] != "!=" else (w[0] != w[2])
        elif len(w) == 3 and w[1] in ("-eq", "-ne", "-gt", "-lt", "-ge", "-le") and all(x.lstrip("-").isdigit() for x in (w[0], w[2])):
            a, b = int(w[0]), int(w[2])
            r = {"-eq": a == b, "-ne": a != b, "-gt": a > b, "-lt": a < b, "-ge": a >= b, "-le": a <= b}[w[1]]
        elif len(w) in (1, 2) and w[0] in ("-z", "-n"):
            val = w[1] if len(w) == 2 else ""
            r = (val == "") if w[0] == "-z" else (val != "")
        else:
            return None
        return (not r) if neg else r


def _split_top(s: str, op: str) -> list[str]:
    """`s` split on `op` outside quotes and brackets."""
    parts, depth, q, start, i = [], 0, None, 0, 0
    while i < len(s):
        c = s[i]
        if q:
            if c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif depth == 0 and s.startswith(op, i):
            parts.append(s[start:i])
            start = i + len(op)
            i += len(op)
            continue
        i += 1
    parts.append(s[start:])
    return [p.strip() for p in parts]


def _matching(s: str, open_at: int) -> int:
    """Index of the parenthesis closing the one at `open_at`."""
    depth = 0
    for i in range(open_at, len(s)):
        if s[i] == "(":
            depth += 1
        elif s[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ShellError("unbalanced parentheses in $( )")


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv, ast.Mod: operator.mod}


def _eval_int(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return int(_OPS[type(node.op)](_eval_int(node.left), _eval_int(node.right)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_int(node.operand)
    raise ValueError("not integer arithmetic")


def _unquote(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def _split_if(line: str) -> tuple[str, str] | None:
    """`if COND; then REST` -> (COND, REST)."""
    m = re.match(r"^(if|elif)\s+(.*?)\s*;?\s*then\b\s*(.*)$", line, re.S)
    return (m.group(2), m.group(3)) if m else None


def run_script(text: str, is_launch: object, env: dict[str, str] | None = None) -> Script | None:
    """Evaluates `text` up to the first command for which `is_launch(words)` is true and returns that
    command; None when no line launches. Raises ShellError on what it cannot follow."""
    sh = Shell(env)
    notes: list[str] = []
    # a stack of (this branch runs, some earlier branch of this `if` ran, undecided)
    stack: list[list] = []

    def active() -> bool:
        return all(f[0] for f in stack)

    lines = logical_lines(text)
    queue = list(lines)
    while queue:
        line = queue.pop(0)
        # `a; b` on one line (not inside an array or [[ ]])
        pieces = _split_top(line, ";") if ";" in line and "=(" not in line else [line]
        if len(pieces) > 1 and not line.startswith(("if ", "elif ")):
            queue[:0] = [p for p in pieces if p]
            continue
        if line.startswith(("if ", "elif ")):
            cond_rest = _split_if(line)
            if cond_rest is None:
                # `if cond` with `then` on the next line
                nxt = queue.pop(0) if queue else ""
                cond_rest = (line.split(None, 1)[1], nxt[4:] if nxt.startswith("then") else "")
            cond, rest = cond_rest
            if line.startswith("if "):
                parent = active()
                t = sh.test(cond) if parent else False
                if t is None:
                    notes.append(f"a branch whose test cannot be decided was skipped: {cond[:80]}")
                stack.append([bool(t), bool(t), t is None, parent])
            elif stack:
                top = stack[-1]
                t = sh.test(cond) if top[3] and not top[1] and not top[2] else False
                if t is None:
                    notes.append(f"a branch whose test cannot be decided was skipped: {cond[:80]}")
                    top[2] = True
                top[0] = bool(t)
                top[1] = top[1] or bool(t)
            if rest.strip():
                queue.insert(0, rest.strip())
            continue
        if line == "else" or line.startswith("else "):
            if stack:
                top = stack[-1]
                top[0] = top[3] and not top[1] and not top[2]
            rest = line[4:].strip()
            if rest:
                queue.insert(0, rest)
            continue
        if line == "fi":
            if stack:
                stack.pop()
            continue
        if line in ("then", "do", "done") or not active():
            continue
        m = _ASSIGN.match(line)
        if m:
            sh.assign(m.group(1), m.group(2) == "+", m.group(3))
            continue
        words = sh.words(line)
        if words and is_launch(words):                   # type: ignore[operator]
            return Script(words, dict(sh.vars), notes)
    return None
