"""The project's modules import each other one way: no cycle, function-level imports included.

Every ``import`` / ``from ... import`` in every module of the four packages (at any depth of the
code: inside functions too, which is where cycles used to hide) is an edge to the project module it
loads; ``from pkg import sub`` is an edge to ``pkg.sub`` when ``sub`` is a module (a package's
``__init__`` that imports its modules is the usual re-export, and those modules must not import the
package back); imports under ``if TYPE_CHECKING:`` never run and are not edges.  A cycle is a
strongly connected component of more than one module.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("emulator", "actors", "protocols", "tools")


def project_modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def import_graph() -> dict[str, set[str]]:
    mods = project_modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        here = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            for t in targets:
                r = resolve(t)
                if r is not None and r != m:
                    graph[m].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
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


def test_no_import_cycle_among_the_projects_modules():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_check_sees_a_function_level_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    g = import_graph()
    assert "emulator.clock" in g["emulator.actor"]            # a module-level import is an edge
    assert "tools.run.runner" in g["tools.cli"] or any(m.startswith("tools.run") for m in g["tools.cli"])


def test_dependencies_point_down():
    """DESIGN.md §2: tools -> actors -> emulator, protocols; emulator -> protocols only for the codec."""
    for m, deps in import_graph().items():
        top = m.split(".")[0]
        for d in deps:
            dtop = d.split(".")[0]
            if top == "emulator":
                assert dtop in ("emulator", "protocols"), (m, d)
                assert dtop != "protocols" or d == "protocols.codec", (m, d)
            if top == "protocols":
                assert dtop == "protocols", (m, d)
            if top == "actors":
                assert dtop != "tools", (m, d)
