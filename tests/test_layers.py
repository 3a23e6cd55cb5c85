"""Layers look down only (the project's design rule, docs/ARCHITECTURE.md "Layers"): scripts -> train_jax.py ->
training/ -> data/, models/, optimizers/ -> core/, and no module imports one that imports it back, directly or
through others. Inside training/ the same holds between its sub-packages (SUBPACKAGE_RANKS), and training/ itself
holds no module but its face (__init__.py).

The graph is read from the source with `ast`: every import statement counts, at the top of a file or inside a
function (a lazy import still makes the two modules depend on each other), and only the project's own modules are
nodes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "data", "models", "optimizers", "training")
# Lower ranks are imported by higher ones, never the reverse; equal ranks in different packages do not import each
# other either (data/, models/ and optimizers/ are independent of one another).
RANKS = {"core": 0, "data": 1, "models": 1, "optimizers": 1, "training": 2, "train_jax": 3, "scripts": 4}
# training/'s sub-packages, by the same rule: a module imports its own sub-package and those of lower rank only. The
# package face (training/__init__.py) stands above them all.
SUBPACKAGE_RANKS = {
    "training.config": 0,
    "training.distributed": 0,
    "training.step": 1,
    "training.evaluation": 1,
    "training.analysis": 2,
    "training.checkpoints": 2,
    "training.reporting": 3,
    "training.pipeline": 3,
    "training.loop": 4,
    "training.cli": 4,
    "training": 5,
}
# Known cycles still to be removed, each as the set of its modules; an entry that is no longer a cycle fails the
# test until it is deleted.
KNOWN_CYCLES: list[set[str]] = []


def module_files() -> dict[str, Path]:
    """Module name (`data.sources`, `data` for data/__init__.py, `train_jax`, `scripts.bench`) -> its file."""
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    files += [ROOT / "train_jax.py", *(ROOT / "scripts").rglob("*.py")]
    modules = {}
    for path in files:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module an imported dotted name refers to (its longest prefix that is one), or None (a library)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, for every import statement in the file."""
    modules = module_files()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing module's package, `level - 1` packages up
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{alias.name}" for alias in node.names]  # `from pkg import module` or a name
            else:
                continue
            for name in names:
                target = _resolve(name, modules)
                if target is not None and target != module:
                    edges.setdefault(target, node.lineno)
    return graph


def layer(module: str) -> str:
    return module.split(".")[0]


def subpackage(module: str) -> str:
    """training/'s sub-package a module belongs to (`training` for the face); the module itself elsewhere."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "training" and len(parts) > 1 else module


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The graph's strongly connected components of two or more modules (Tarjan's algorithm), each as a closed path
    through its modules: [a, b, ..., a]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_closed_path(graph, component) for component in found]


def _closed_path(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module (by name) back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return paths[v] + [start]
                if w in component and w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no path back to {start} in {component}")


def describe(graph: dict[str, dict[str, int]], path: list[str]) -> str:
    """`a -> b (a.py:12) -> a (b.py:3)`: each hop with the line that imports it."""
    hops = [path[0]] + [f"{b} ({module_files()[a].relative_to(ROOT)}:{graph[a][b]})" for a, b in zip(path, path[1:])]
    return " -> ".join(hops)


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return import_graph()


def test_the_graph_holds_every_layer_and_their_imports(graph):
    """What the other tests rely on: each layer is found, and an import at the top of a file, inside a function and
    through `from package import module` is an edge."""
    assert {layer(m) for m in graph} == set(RANKS)
    assert "training.pipeline.build" in graph["train_jax"] and "training.config" in graph["train_jax"]  # and
    # `from training import config`
    assert "data.file_checks" in graph["data.sources"]  # imported inside a function
    assert "core.errors" in graph["data.sources"]


def test_no_module_imports_a_higher_layer_or_a_sibling_package(graph):
    wrong = [
        f"{a} imports {b} ({module_files()[a].relative_to(ROOT)}:{line}): {layer(a)} may import only "
        f"{', '.join(sorted(p for p, r in RANKS.items() if r < RANKS[layer(a)])) or 'nothing of the project'}"
        for a, edges in sorted(graph.items())
        for b, line in sorted(edges.items())
        if layer(a) != layer(b) and RANKS[layer(b)] >= RANKS[layer(a)]
    ]
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_one_that_imports_it_back(graph):
    found = cycles(graph)
    unknown = [path for path in found if set(path) not in KNOWN_CYCLES]
    assert not unknown, "import cycles:\n" + "\n".join(describe(graph, path) for path in unknown)
    gone = [known for known in KNOWN_CYCLES if known not in [set(path) for path in found]]
    assert not gone, f"no longer cycles, delete them from KNOWN_CYCLES: {gone}"


def test_training_holds_sub_packages_and_its_face_only():
    loose = sorted(p.name for p in (ROOT / "training").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules at training/'s top level, move them into a sub-package: {loose}"
    packages = {f"training.{p.name}" for p in (ROOT / "training").iterdir() if (p / "__init__.py").is_file()}
    assert packages | {"training"} == set(SUBPACKAGE_RANKS), "every sub-package has a rank, every rank a package"


def test_no_training_module_imports_a_higher_or_sibling_sub_package(graph):
    wrong = [
        f"{a} imports {b} ({module_files()[a].relative_to(ROOT)}:{line}): {subpackage(a)} may import only "
        f"{', '.join(sorted(p for p, r in SUBPACKAGE_RANKS.items() if r < SUBPACKAGE_RANKS[subpackage(a)]))}"
        for a, edges in sorted(graph.items())
        if layer(a) == "training"
        for b, line in sorted(edges.items())
        if layer(b) == "training"
        and subpackage(a) != subpackage(b)
        and SUBPACKAGE_RANKS[subpackage(b)] >= SUBPACKAGE_RANKS[subpackage(a)]
    ]
    assert not wrong, "\n".join(wrong)
