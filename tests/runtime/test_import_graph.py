"""The runtime package has no import circles: every import, including the deferred ones inside functions, is
an edge (a lazy import that closes a circle is still a circle, only hidden until run time)."""

from __future__ import annotations

import ast
from pathlib import Path

import tpu_agent

PACKAGE_ROOT = Path(tpu_agent.__file__).parent


def module_name(path: Path, package_root: Path) -> str:
    parts = path.relative_to(package_root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, package_root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Module -> modules under ``root`` it imports (``package_root`` is the top package ``root`` lies in)."""
    modules = {module_name(p, package_root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_runtime_has_no_import_circles() -> None:
    assert circles(import_graph(PACKAGE_ROOT / "runtime")) == []


def test_the_checker_finds_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    package = tmp_path / "tpu_agent" / "demo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from tpu_agent.demo import b\n")
    (package / "b.py").write_text("def later():\n    from tpu_agent.demo import a\n")
    assert circles(import_graph(package, tmp_path / "tpu_agent")) == [["tpu_agent.demo.a", "tpu_agent.demo.b"]]
