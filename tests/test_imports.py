"""The house: the import graph of radixflow_sglang/ and eval/ has no circles, adapter/ does not
reach up into testing/, and no test module imports another.

Imports are read with ast, so an import inside a function counts as much as one at the top: a
function-local import hides a circle from Python's loader, not from the design. Pure Python
(no SGLang import): runs anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("radixflow_sglang", "eval")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The most specific known module `name` names (a package's __init__ when it names one)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Known modules `mod` imports anywhere in its file (functions and TYPE_CHECKING included)."""
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            # NOTE: `from pkg import sub` imports the module pkg.sub when there is one
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]
        else:
            continue
        out.update(t for n in names if (t := _resolve(n, known)) is not None)
    out.discard(mod)  # NOTE: simulated.py names itself under __main__ (spawn pickles by name)
    return out


def graph() -> dict[str, set[str]]:
    known = _modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


def test_circles_are_found():
    # NOTE: the checker must be able to fail
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(g) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_function_local_imports_count(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from .other import x\n")
    assert imports_of("pkg.m", p, {"pkg.m": p, "pkg.other": p}) == {"pkg.other"}


def test_no_circles():
    assert circles(graph()) == []


def test_adapter_does_not_import_testing():
    up = {m: sorted(t for t in ts if t.startswith("radixflow_sglang.testing"))
          for m, ts in graph().items() if m.startswith("radixflow_sglang.adapter")}
    assert {m: ts for m, ts in up.items() if ts} == {}


def test_core_imports_only_core():
    """core/ is engine-free: it imports nothing of the package outside core/ (and no sglang,
    checked by importing it in test_core.py)."""
    out = {m: sorted(t for t in ts if not t.startswith("radixflow_sglang.core"))
           for m, ts in graph().items() if m.startswith("radixflow_sglang.core")}
    assert {m: ts for m, ts in out.items() if ts} == {}


def test_no_test_imports_a_test():
    bad = []
    for p in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{p.name}: {m}" for m in mods if m.startswith("tests") or
                    m.startswith("test_")]
    assert bad == []
