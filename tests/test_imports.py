"""The package's import graph: no cycles, and no imports inside functions except of optional
dependencies. Built from the source with `ast`, so it sees every module, imported or not."""
import ast

from conftest import ROOT

PACKAGE = ROOT / "simtrain"
# Imported where they are used: torch and torch_mlu only measure (`simtrain bench`), dask only
# runs sweeps on a cluster, so simulating needs none of them; matplotlib is required but only
# commands that draw pay for it (importing pyplot doubles the command line's 0.6 s start-up)
# chakra and google (its protobuf runtime): the optional Chakra export and replay
DEFERRED = {"torch", "torch_mlu", "dask", "distributed", "matplotlib", "chakra", "google"}


def module_name(path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(node, mod: str, is_pkg: bool, known: set) -> list:
    """The simtrain modules an import statement loads (a `from package import name` counts the
    submodule when `name` is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "simtrain"]
    base = node.module or ""
    if node.level:
        pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
        pkg = pkg[: len(pkg) - node.level + 1]
        base = ".".join(pkg + ([base] if base else []))
    if base.split(".")[0] != "simtrain":
        return []
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        out.append(sub if sub in known else base)
    return out


def graph() -> dict:
    mods = modules()
    known = set(mods)
    g = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        deps = set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(imported(node, m, p.name == "__init__.py", known))
            elif isinstance(node, ast.If):          # `if TYPE_CHECKING:` imports load nothing at run time
                pass
        g[m] = sorted(d for d in deps if d != m and d in known)
    return g


def cycles(g: dict) -> list:
    """Strongly connected components of more than one module (Tarjan), plus self-loops."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    # a -> b -> c -> a is one component; d hangs off it
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": []}) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_function_level_imports():
    found = []
    for m, p in modules().items():
        tree = ast.parse(p.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                else:
                    continue
                if any(n.split(".")[0] not in DEFERRED for n in names):
                    found.append(f"{m}:{node.lineno} {', '.join(names)}")
    assert found == []
