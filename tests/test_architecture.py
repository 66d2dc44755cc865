"""The package's shape: layers that only import downwards, no import circles between modules, no module that
rebinds another's globals, and no module that has grown past one job.

These are the structural rules of the codebase, kept by a test so a refactor that reintroduces a circle or an
upward import fails CI instead of surfacing as an ImportError (or a tangle) later.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "tpu_agent"
MAX_LINES_WITHOUT_REASON = 500
MAX_LINES = 600  # the hard cap: past it a module is split by job, whatever its docstring says
SIZE_REASON_MARKER = "Why this module is long:"
# The ``torch_tpu`` face a run puts on sys.path lives under runtime/ but is a front end: user code imports it (as
# ``torch_tpu``), nothing in the package does, and its profiler writes sessions with profile's XSpace writer.
SURFACE = "runtime.emulated.surface"

# The package's top-level modules and subpackages by layer, lowest first. A module imports from its own layer and
# the layers below it, never from one above (lazy in-function imports count). "tpu_agent" is the package's own
# __init__ (its version); "__main__" is ``python -m tpu_agent``, the CLI under another name.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tpu_agent", "errors", "fsutil", "processes", "chips"),  # what every layer may use
    ("migrate",),  # source rewriting: needs no runtime
    ("runtime",),  # the tpu device (emulated or real), its launcher and event log
    ("profile", "check", "estimate"),  # tools that run a script on the runtime and judge what it did
    ("cli", "plugins", "__main__", SURFACE),  # the front ends
)


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


def _unit(module: str) -> str:
    """The top-level module or subpackage ``module`` belongs to (``tpu_agent`` for the package's __init__)."""
    if module.startswith(f"tpu_agent.{SURFACE}"):
        return SURFACE
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer_of() -> dict[str, int]:
    return {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def upward_imports(graph: dict[str, set[str]], layer_of: dict[str, int]) -> set[tuple[str, str]]:
    """(importing module, imported unit) for every import from a lower layer into a higher one."""
    return {
        (source, _unit(target))
        for source, targets in graph.items()
        for target in targets
        if layer_of[_unit(target)] > layer_of[_unit(source)]
    }


def test_every_top_level_module_has_a_layer() -> None:
    units = {_unit(module) for module in _package_modules()}
    placed = [unit for units in LAYERS for unit in units]
    assert len(placed) == len(set(placed)), "a unit is listed in two layers"
    assert units == set(placed), (
        f"place new top-level modules in LAYERS: {sorted(units - set(placed))}; "
        f"remove gone ones: {sorted(set(placed) - units)}"
    )


def test_layers_only_import_downwards() -> None:
    found = upward_imports(import_graph(), _layer_of())
    assert not found, "upward imports (move the shared piece down, or hand it in from above): " + "; ".join(
        f"{source} -> {unit}" for source, unit in sorted(found)
    )


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {"tpu_agent.runtime.a": {"tpu_agent.cli.b", "tpu_agent.errors"}, "tpu_agent.cli.b": {"tpu_agent.runtime.a"}}
    assert upward_imports(graph, _layer_of()) == {("tpu_agent.runtime.a", "cli")}


def _module_aliases(tree: ast.Module, module: str, is_package: bool, modules: set[str]) -> dict[str, str]:
    """Local name -> package module, for every name an import statement binds to a module of the package."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "tpu_agent"
        elif isinstance(node, ast.ImportFrom):
            base = next(iter(_imported_names(ast.Module(body=[node], type_ignores=[]), module, is_package)))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    return aliases


def foreign_assignments(source: str, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """``line: target`` for each assignment, augmented assignment, ``del`` or ``setattr`` of an attribute of
    another package module, through any name an import bound to it (``tt.X = 1``, ``tpu_agent.a.b.X = 1``)."""
    tree = ast.parse(source)
    aliases = _module_aliases(tree, module, is_package, modules)

    def resolve(expression: ast.expr) -> str | None:
        if isinstance(expression, ast.Name):
            return aliases.get(expression.id)
        if isinstance(expression, ast.Attribute):
            base = resolve(expression.value)
            if base is not None and f"{base}.{expression.attr}" in modules:
                return f"{base}.{expression.attr}"
        return None

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
        ):
            owner = resolve(node.args[0])
            if owner is not None and owner != module:
                found.append((node.lineno, f"{node.func.id}({owner}, ...)"))
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.ctx, (ast.Store, ast.Del)):
                    owner = resolve(part.value)
                    if owner is not None and owner != module:
                        found.append((node.lineno, f"{owner}.{part.attr}"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_no_module_rebinds_another_modules_globals() -> None:
    """An extension point is a named function (``deferred.set_executor``, ``placement.place_data_on``), not a
    global rebound from outside: whoever reads the owning module then sees every way it can change."""
    modules = _package_modules()
    names = set(modules)
    found = [
        f"{path.relative_to(PACKAGE_ROOT.parent)}:{hit}"
        for name, path in modules.items()
        for hit in foreign_assignments(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", names)
    ]
    assert not found, "assignments to another module's globals (give the owner a setter): " + "; ".join(found)


def test_the_assignment_check_finds_a_rebinding() -> None:
    modules = {"tpu_agent", "tpu_agent.runtime", "tpu_agent.runtime.a", "tpu_agent.estimate.b"}
    source = (
        "import tpu_agent.runtime.a\n"
        "from tpu_agent.runtime import a as alias\n"
        "def f():\n"
        "    from tpu_agent.runtime import a\n"
        "    a.X = 1\n"
        "    alias.Y += 1\n"
        "    setattr(a, 'Z', 2)\n"
        "    tpu_agent.runtime.a.W = 3\n"
        "    local = object(); local.V = 4\n"
    )
    assert foreign_assignments(source, "tpu_agent.estimate.b", False, modules) == [
        "5: tpu_agent.runtime.a.X",
        "6: tpu_agent.runtime.a.Y",
        "7: setattr(tpu_agent.runtime.a, ...)",
        "8: tpu_agent.runtime.a.W",
    ]


@pytest.mark.parametrize("path", sorted(PACKAGE_ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_no_module_is_over_the_hard_cap(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, (
        f"{path.relative_to(PACKAGE_ROOT.parent)} has {lines} lines, over the {MAX_LINES}-line cap: split it by job "
        "(a reason in its docstring does not lift this cap)"
    )


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
