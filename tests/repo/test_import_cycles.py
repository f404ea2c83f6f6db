"""No import cycle between modules of the three packages, lazy imports included.

A cycle broken by an import inside a function still couples the two modules both ways: neither can be
read, tested or moved without the other. Every ``import`` statement counts (the walker of
``tests/repo/test_layers.py``), and ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module.
"""

from __future__ import annotations

from tests.repo.test_layers import PACKAGES, ROOT, imports_of, module_files


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph() -> dict[str, set[str]]:
    """``{module: modules of the three packages it imports}``. An import of ``a.b.c`` counts for the longest
    prefix that is a module; a package's ``__init__`` counts only when it is imported by its own name."""
    files = [p for pkg in PACKAGES for p in module_files(pkg)]
    known = {module_name(p) for p in files}
    out: dict[str, set[str]] = {}
    for p in files:
        src = module_name(p)
        deps = set()
        for m in imports_of(p):
            parts = m.split(".")
            for k in range(len(parts), 0, -1):
                name = ".".join(parts[:k])
                if name in known:
                    if name != src and not (k < len(parts) and k == 1 and ".".join(parts[:2]) in known):
                        deps.add(name)
                    break
        out[src] = deps
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
    assert cycles(module_graph()) == []
