"""Every public function and public method of a public class in simtrain/ is fully annotated:
each argument (but the `self` / `cls` of a method) and the return. Built from the source with
`ast`, so it sees every module, imported or not.

The walk covers every module of the package and the assertion holds for all of them: a new
public function without annotations fails the test, named by file and line. Run this file directly
(`python tests/test_typing.py`) for the same report outside pytest.
"""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "simtrain"

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def public(name: str) -> bool:
    return not name.startswith("_")


def gaps_of_function(fn: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None) -> list[str]:
    """What `fn` leaves unannotated: argument names, and "return"."""
    a = fn.args
    positional = a.posonlyargs + a.args
    decorators = {d.id for d in fn.decorator_list if isinstance(d, ast.Name)}
    if owner is not None and "staticmethod" not in decorators and positional:
        positional = positional[1:]                     # self, cls
    params = positional + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p is not None]
    out = [p.arg for p in params if p.annotation is None]
    if fn.returns is None:
        out.append("return")
    return out


def gaps_of_body(body: list[ast.stmt], owner: str | None) -> list[str]:
    out = []
    for node in body:
        if isinstance(node, FUNCTIONS) and public(node.name):
            missing = gaps_of_function(node, owner)
            if missing:
                where = f"{owner}.{node.name}" if owner else node.name
                out.append(f"{node.lineno}: {where} ({', '.join(missing)})")
        elif isinstance(node, ast.ClassDef) and public(node.name):
            name = f"{owner}.{node.name}" if owner else node.name
            out.extend(gaps_of_body(node.body, name))
        elif isinstance(node, ast.If):                  # `if TYPE_CHECKING:` / optional definitions
            out.extend(gaps_of_body(node.body + node.orelse, owner))
    return out


def gaps(path: Path) -> list[str]:
    return gaps_of_body(ast.parse(path.read_text()).body, None)


def report() -> dict[str, list[str]]:
    """Per module (path relative to the repository root) what it leaves unannotated."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        found = gaps(p)
        if found:
            out[p.relative_to(ROOT).as_posix()] = found
    return out


def render(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{rel}:\n" + "\n".join(f"    {g}" for g in items) for rel, items in found.items())


def test_finder_sees_what_is_missing():
    src = ast.parse(
        "def f(a, b: int): ...\n"
        "def g(*args: int, **kw: str) -> None: ...\n"
        "def _private(a): ...\n"
        "class C:\n"
        "    def m(self, x: int): ...\n"
        "    @staticmethod\n"
        "    def s(x) -> int: ...\n"
        "    @classmethod\n"
        "    def c(cls) -> None: ...\n"
        "    def __init__(self, x): ...\n"
        "class _Hidden:\n"
        "    def m(self, x): ...\n"
    )
    assert gaps_of_body(src.body, None) == ["1: f (a, return)", "5: C.m (return)", "7: C.s (x)"]


def test_walk_sees_the_package():
    """An empty walk (a moved package) would pass the assertion below without checking anything."""
    assert (PACKAGE / "__init__.py").is_file() and len(list(PACKAGE.rglob("*.py"))) > 50


def test_public_functions_are_annotated():
    found = report()
    assert not found, f"unannotated public functions:\n{render(found)}"


if __name__ == "__main__":
    found = report()
    print(render(found) or "every public function is annotated")
    sys.exit(1 if found else 0)
