"""The package's shape: no import circles between modules, and no module that has grown past one job.

These are the structural rules of the codebase (one job per module, layers that only import downwards), kept
by a test so a refactor that reintroduces a circle fails CI instead of surfacing as an ImportError later.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "tpu_agent"
MAX_LINES_WITHOUT_REASON = 500
SIZE_REASON_MARKER = "Why this module is long:"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}


def _is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every module name an import statement reaches, lazy (in-function) imports included: a circle that only
    closes at call time is still a circle. Imports under ``if TYPE_CHECKING:`` never run and are skipped."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".")
                base_parts = base_parts if is_package else base_parts[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (a ``from pkg import name`` edge goes to ``pkg.name`` when that
    is a module, else to ``pkg``)."""
    modules = _package_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = set()
        for imported in _imported_names(tree, name, path.name == "__init__.py"):
            if imported in modules and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components with more than one module are the import circles."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = lowlink[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = lowlink[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    lowlink[node] = min(lowlink[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                lowlink[parent] = min(lowlink[parent], lowlink[node])
            if lowlink[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _is_parent_package_edge(source: str, target: str) -> bool:
    """A package's ``__init__`` re-exporting its submodules while a submodule imports a sibling through the
    package is how Python packages work; only edges between two non-ancestor modules can form a real circle."""
    return source.startswith(target + ".") or target.startswith(source + ".")


def test_import_graph_has_no_circles() -> None:
    graph = import_graph()
    graph = {
        source: {t for t in targets if not _is_parent_package_edge(source, t)} for source, targets in graph.items()
    }
    circles = [component for component in _strongly_connected_components(graph) if len(component) > 1]
    assert not circles, "import circles (break them: move the shared piece into its own module): " + "; ".join(
        " <-> ".join(component) for component in circles
    )


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [c for c in _strongly_connected_components(graph) if len(c) > 1] == [["a", "b", "c"]]


@pytest.mark.parametrize("path", sorted(PACKAGE_ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_long_modules_say_why(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    if source.count("\n") <= MAX_LINES_WITHOUT_REASON:
        return
    docstring = ast.get_docstring(ast.parse(source)) or ""
    assert SIZE_REASON_MARKER in docstring, (
        f"{path.relative_to(PACKAGE_ROOT.parent)} has {source.count(chr(10))} lines: split it by job, or say in its "
        f"module docstring, after {SIZE_REASON_MARKER!r}, why it stays one module"
    )
