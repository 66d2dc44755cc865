"""What a module binds to each name and attribute: the value of every binding, in every scope.

Rules that need to know what a name holds where it is read (``props.major`` after ``props =
torch.cuda.get_device_properties(0)`` at module level or in ``__init__`` as ``self.props``, ``**pg_kw`` after
``pg_kw = {"device_id": ...}``) ask whether *every* binding of its key is of one kind. Keys are those of
:mod:`~tpu_agent.migrate.analysis.valueflow`: ``name:x`` for a plain name, ``attr:x`` for an attribute of any
object (``self.x``, ``cls.x``, ``cfg.x``); an assignment in a class body binds both, since the class attribute is
read as ``self.x``. Scopes are approximated by name, as there: a name bound to something else anywhere in the
module (another function's parameter, a loop variable) counts against it, which errs towards leaving code as it
is, never towards a rewrite.

Why the stdlib ``ast`` and not libcst's ScopeProvider: the rule pass visits a module whose inert top-level
statements may be stubs (:mod:`~tpu_agent.migrate.engine.gate`), so only the stdlib tree of the whole file sees
every binding, and it costs a fraction of libcst's metadata resolution. The analysis runs only for files whose
text has what a rule asks about.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from tpu_agent.migrate.analysis.astnodes import nodes
from tpu_agent.migrate.analysis.local_names import TYPE_PARAMS, bindings_of
from tpu_agent.migrate.analysis.valueflow import attr_key, name_key

# A binding whose value the module does not show: a parameter, a loop or ``with`` target, an import, a
# ``del``, an augmented assignment, one element of an unpacked tuple.
Value = ast.expr | None


@dataclass
class Bindings:
    """The value of every binding of each key of one module, in source order."""

    values: dict[str, list[Value]] = field(default_factory=dict)

    def of(self, key: str) -> list[Value]:
        return self.values.get(key, [])

    def _bind(self, key: str, value: Value) -> None:
        self.values.setdefault(key, []).append(value)

    def _bind_target(self, target: ast.expr, value: Value) -> None:
        """Bind what an assignment target names; a subscript store binds nothing (it changes the object)."""
        if isinstance(target, ast.Name):
            self._bind(name_key(target.id), value)
        elif isinstance(target, ast.Attribute):
            self._bind(attr_key(target.attr), value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind_target(element, None)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, None)


# the node types :func:`analyse` binds something for (a parsed tree holds these exact classes, never subclasses):
# the other nodes of the walk, most of them, are skipped with one set lookup
_BINDING_NODES: frozenset[type] = frozenset(
    {
        ast.Assign, ast.AnnAssign, ast.NamedExpr, ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension,
        ast.withitem, ast.Delete, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.arg, ast.alias,
        ast.ExceptHandler, ast.MatchAs, ast.MatchStar, ast.MatchMapping,
    }
)  # fmt: skip


def analyse(tree: ast.Module) -> Bindings:
    """Every binding of ``tree``, with its value where the binding shows one."""
    found = Bindings()
    for node in nodes(tree):
        if type(node) not in _BINDING_NODES:
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                found._bind_target(target, node.value)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)):
            if node.value is not None:  # ``x: int`` alone binds nothing
                found._bind_target(node.target, node.value)
        elif isinstance(node, ast.AugAssign):
            found._bind_target(node.target, None)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            found._bind_target(node.target, None)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            found._bind_target(node.optional_vars, None)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                found._bind_target(target, None)
        elif isinstance(node, ast.ClassDef):
            found._bind(name_key(node.name), None)
            for statement in node.body:  # class attributes, read as self.x / cls.x
                if isinstance(statement, ast.Assign):
                    for target in statement.targets:
                        if isinstance(target, ast.Name):
                            found._bind(attr_key(target.id), statement.value)
                elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    found._bind(attr_key(statement.target.id), statement.value)
        elif not isinstance(node, ast.Name):  # names stored to are bound above, with their values
            for name in bound_names(node):
                found._bind(name_key(name), None)
    return found


def bound_names(node: ast.AST) -> list[str]:
    """The names one node binds: a name stored to or deleted, a definition, a parameter, an import, an
    ``except ... as`` or a ``match`` capture (:func:`~.local_names.bindings_of`, with imports, without the
    ``global``/``nonlocal`` declarations and type parameters that rebind no value here)."""
    if isinstance(node, ast.alias):
        return [node.asname or node.name.partition(".")[0]]
    if isinstance(node, (ast.Global, ast.Nonlocal, *TYPE_PARAMS)):
        return []
    return bindings_of(node)


def mentions_name(tree: ast.Module, name: str) -> bool:
    """Whether the module binds ``name`` in any scope, declares it global, or reads it: a name the migration
    must not bind at module level for its own use."""
    for node in nodes(tree):
        if isinstance(node, ast.Name) and node.id == name:
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return True
        if name in bound_names(node):
            return True
    return False


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])
