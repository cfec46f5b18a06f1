"""Imports point one way: ``kernels`` and ``radix_cache`` know nothing of the engine,
``runtime`` knows nothing of the DSL or the benchmarks, the executor nothing of the
scheduler or the server, and no modules import each other in
a cycle. Read from the source with ``ast`` (every import, module-level or inside a
function; those under ``if TYPE_CHECKING:`` count for direction but not for cycles, since
they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "radix_cache", "frontend_lang", "kernels", "bench_agent")
# package -> packages it must not import. The executor gets the scheduler's decisions as
# data (runtime/executor/model_input.py), never its requests.
FORBIDDEN = {
    "kernels": {"runtime", "frontend_lang", "bench_agent"},
    "radix_cache": {"runtime", "frontend_lang", "bench_agent"},
    "runtime": {"frontend_lang", "bench_agent"},
    "runtime.executor": {"runtime.scheduler", "runtime.server"},
}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def module_sources(root: Path = ROOT) -> dict[str, tuple[str, bool]]:
    """module name -> (its source, whether it is a package's ``__init__``)."""
    sources = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            sources[".".join(parts[:-1] if is_package else parts)] = (path.read_text(), is_package)
    return sources


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, bool]]:
    """module -> {imported module of these packages: whether only for type checking}."""
    graph: dict[str, dict[str, bool]] = {}

    def known(dotted: str) -> str | None:  # the longest prefix that is one of our modules
        parts = dotted.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in sources), None)

    for name, (text, is_package) in sources.items():
        tree = ast.parse(text)
        guarded = _type_checking_nodes(tree)
        edges: dict[str, bool] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in sources]
                targets = submodules if len(submodules) == len(node.names) else [module, *submodules]
            else:
                continue
            for target in filter(None, map(known, targets)):
                if target != name:
                    edges[target] = edges.get(target, True) and id(node) in guarded
        graph[name] = edges
    return graph


def wrong_way(graph: dict[str, dict[str, bool]]) -> list[str]:
    found = []
    for module, edges in graph.items():
        banned = {b for package, names in FORBIDDEN.items() if _within(module, package) for b in names}
        found += [f"{module} -> {target}" for target in edges if any(_within(target, b) for b in banned)]
    return sorted(found)


def cycles(graph: dict[str, dict[str, bool]]) -> list[list[str]]:
    """Strongly connected components of more than one module, over imports that run."""
    runs = {m: [t for t, typing_only in edges.items() if not typing_only] for m, edges in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in runs.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in runs:
        if module not in index:
            visit(module)
    return found


def test_kernels_and_the_radix_cache_do_not_import_the_engine_nor_the_engine_the_dsl_or_benchmarks():
    graph = import_graph(module_sources())
    assert len(graph) > 50  # the walk found the packages
    assert wrong_way(graph) == []


def test_no_modules_import_each_other_in_a_cycle():
    assert cycles(import_graph(module_sources())) == []


def test_the_check_finds_a_wrong_way_import_and_a_cycle(tmp_path):
    """The same check on a made-up tree with both faults (so the two tests above can fail)."""
    files = {
        "kernels/__init__.py": "",
        "kernels/a.py": "def f():\n    from runtime.b import g\n",
        "runtime/__init__.py": "",
        "runtime/b.py": "from runtime import c\n",
        "runtime/c.py": "from . import b\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bench_agent import x\n",
        "runtime/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runtime import b\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    for package in ("radix_cache", "frontend_lang", "bench_agent"):
        (tmp_path / package).mkdir()
    (tmp_path / "bench_agent" / "x.py").write_text("")
    graph = import_graph(module_sources(tmp_path))
    assert wrong_way(graph) == ["kernels.a -> runtime.b", "runtime.c -> bench_agent.x"]
    assert cycles(graph) == [["runtime.b", "runtime.c"]]  # d's typing-only import is no cycle
