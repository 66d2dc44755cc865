"""Mappings unpacked into a call with ``**``: whether the module shows everything they hold.

``dist.init_process_group(backend="nccl", **pg_kw)`` after ``pg_kw = {"device_id": torch.device("cuda", rank)}``
(or ``dict(device_id=...)``, or ``pg_kw["device_id"] = ...``) passes arguments the call does not show. A rule
that must see one of them can act on the mapping's entries only when they are all there is: the mapping is
*resolved* when every binding of its name in its scope is a dict display with literal keys or a
``dict(key=value)`` call, and every other use of it reads it, sets a literal key, or unpacks it into the same
function. A parameter, a dict some function returns, ``pg_kw.update(...)``, the mapping handed to another
function: it is unresolved, with the reason, and the rule leaves it to a person.

Names are resolved by Python's scope rules (a function's name is local when the function binds it anywhere;
class bodies do not enclose their methods), so ``**kwargs`` parameters elsewhere in the module do not spoil a
``kwargs = {...}`` of its own. A scope is named by the path of ``def``/``class`` names around it, which is
what the rule pass knows of where it is (its statement stack); two definitions with one path share a scope,
which only adds bindings and uses to both. What the walk does not model (``global``/``nonlocal`` of the name,
lambda and comprehension variables) counts as a binding of unknown value: unresolved, never rewritten.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from tpu_agent.migrate.analysis.astnodes import nodes
from tpu_agent.migrate.analysis.bindings import Value, bound_names
from tpu_agent.migrate.analysis.valueflow import call_name

ScopePath = tuple[str, ...]  # the def/class names around a scope; () is the module
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# methods that read a mapping without changing it
_READS = frozenset({"get", "keys", "items", "values", "copy"})
_NOT_SHOWN = "is bound where its value is not shown (a parameter, a loop variable, a global...)"


@dataclass
class Unpacked:
    """The mappings of one module unpacked into one function, by defining scope and name."""

    classes: set[ScopePath] = field(default_factory=set)  # scopes that are class bodies
    local: dict[ScopePath, set[str]] = field(default_factory=dict)  # the watched names each scope binds
    reasons: dict[tuple[ScopePath, str], str | None] = field(default_factory=dict)  # None: resolved

    def resolve(self, path: ScopePath, name: str) -> ScopePath:
        """The scope whose binding of ``name`` code in scope ``path`` sees: the innermost scope binding it,
        skipping class bodies other than the innermost, else the module."""
        for end in range(len(path), 0, -1):
            scope = path[:end]
            if (end == len(path) or scope not in self.classes) and name in self.local.get(scope, ()):
                return scope
        return ()

    def is_unpacked(self, path: ScopePath, name: str) -> bool:
        """Whether the mapping ``name`` seen from scope ``path`` is unpacked into the function."""
        return (self.resolve(path, name), name) in self.reasons

    def reason(self, path: ScopePath, name: str) -> str | None:
        """None when that mapping is resolved, else why not (for a report); unknown mappings are unresolved."""
        return self.reasons.get((self.resolve(path, name), name), f"{name} is not analysed")


def analyse(tree: ast.Module, function: str) -> Unpacked:
    """The mappings ``tree`` unpacks with ``**`` into calls of ``function`` (matched by its last name:
    ``init_process_group`` is ``dist.init_process_group`` too), each with its verdict."""
    watched = {
        keyword.value.id
        for node in nodes(tree)
        if isinstance(node, ast.Call) and call_name(node) == function
        for keyword in node.keywords
        if keyword.arg is None and isinstance(keyword.value, ast.Name)
    }
    found = Unpacked()
    if not watched:
        return found
    walk = list(_scoped(tree, ()))
    for node, path, _, _ in walk:  # first the scopes' own names, which decide every resolution
        if isinstance(node, ast.ClassDef):
            found.classes.add((*path, node.name))
        found.local.setdefault(path, set()).update(watched.intersection(bound_names(node)))
    values: dict[tuple[ScopePath, str], list[Value]] = {}
    problems: dict[tuple[ScopePath, str], str] = {}
    for node, path, parent, grand in walk:
        if isinstance(node, ast.Call) and call_name(node) == function:
            for keyword in node.keywords:
                if keyword.arg is None and isinstance(keyword.value, ast.Name):
                    found.reasons[(found.resolve(path, keyword.value.id), keyword.value.id)] = None
        for name in watched.intersection(bound_names(node)):
            value = _bound_value(node, parent)
            values.setdefault((found.resolve(path, name), name), []).append(value)
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in watched.intersection(node.names):
                problems.setdefault(((), name), f"{name} {_NOT_SHOWN}")  # the module's name: not analysed
                problems.setdefault((found.resolve(path, name), name), f"{name} {_NOT_SHOWN}")
        if isinstance(node, ast.Name) and node.id in watched and isinstance(node.ctx, ast.Load):
            problem = _use_problem(node, parent, grand, function)
            if problem is not None:
                problems.setdefault((found.resolve(path, node.id), node.id), problem)
    for key in found.reasons:
        found.reasons[key] = problems.get(key) or _binding_problem(key[1], values.get(key, []))
    return found


def _scoped(
    node: ast.AST, path: ScopePath, parent: ast.AST | None = None, grand: ast.AST | None = None
) -> Iterator[tuple[ast.AST, ScopePath, ast.AST | None, ast.AST | None]]:
    """Every node with the scope path it is in, its parent and grandparent. A def's parameters and body are in
    its own scope, a class's body in the class's; decorators, bases and the name are in the enclosing one."""
    yield node, path, parent, grand
    inner = (*path, node.name) if isinstance(node, (*_FUNCTIONS, ast.ClassDef)) else path
    for name, value in ast.iter_fields(node):
        scope = inner if name in ("args", "body") else path
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST):
                yield from _scoped(child, scope, node, parent)


def _bound_value(node: ast.AST, parent: ast.AST | None) -> Value:
    """The value a binding node gives its name: the right side of ``name = value``, else unknown."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        if isinstance(parent, ast.Assign) and node in parent.targets:
            return parent.value
        if isinstance(parent, (ast.AnnAssign, ast.NamedExpr)) and parent.target is node:
            return parent.value
    return None


def _binding_problem(name: str, values: list[Value]) -> str | None:
    if not values:
        return f"{name} is not bound in this module"
    for value in values:
        if value is None:
            return f"{name} {_NOT_SHOWN}"
        if not _is_visible_mapping(value):
            return f"{name} is bound on line {value.lineno} to something other than a dict of literal keys"
    return None


def _is_visible_mapping(value: ast.expr) -> bool:
    """``{"k": v, ...}`` with literal string keys, or ``dict(k=v, ...)``: every key it holds is written out."""
    if isinstance(value, ast.Dict):
        return all(isinstance(key, ast.Constant) and isinstance(key.value, str) for key in value.keys)
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "dict"
        and not value.args
        and all(keyword.arg is not None for keyword in value.keywords)
    )


def _use_problem(name: ast.Name, parent: ast.AST | None, grand: ast.AST | None, function: str) -> str | None:
    """None for a use that keeps every entry visible, else how it may change or pass on the mapping."""
    where = f"on line {name.lineno}"
    if isinstance(parent, ast.keyword) and parent.arg is None:
        callee = call_name(grand) if isinstance(grand, ast.Call) else None
        return None if callee == function else f"{name.id} is also unpacked into {callee or 'another call'}() {where}"
    if isinstance(parent, ast.Subscript) and parent.value is name:
        literal = isinstance(parent.slice, ast.Constant) and isinstance(parent.slice.value, str)
        if isinstance(parent.ctx, ast.Load) or (isinstance(parent.ctx, ast.Store) and literal):
            return None
        return f"{name.id} gets a key that is not written out {where}"
    if isinstance(parent, ast.Attribute) and parent.attr in _READS and isinstance(grand, ast.Call):
        return None
    if isinstance(parent, ast.Compare):
        return None  # "device_id" in pg_kw
    return f"{name.id} is used {where} in a way that may change what it holds"
