"""The names a function binds for itself: its parameters and what its body assigns, so that a parameter
``config`` in ``def __init__(self, config)`` is not the module's ``import torch._inductor.config as config``.

Python decides a name's scope per function: a name the function binds anywhere in its body (not declared
``global`` or ``nonlocal``) is local throughout it. Nested ``def``, ``class`` and ``lambda`` bodies and
comprehensions have scopes of their own and are not entered; imports inside the function are left to the
import tracking that reads them. The same bindings read off the stdlib tree (:func:`bindings_of`) give the cheap
module-wide pre-checks: a name the module never binds is no function's local, and an import nothing rebinds is the
name's only meaning.
"""

from __future__ import annotations

import ast
from typing import Any, cast

import libcst as cst

from tpu_agent.migrate.analysis.astnodes import nodes
from tpu_agent.migrate.cstnodes import TreeReader


def target_names(target: cst.CSTNode) -> list[str]:
    """The names an assignment target binds: ``x``, each name of ``a, (b, *c)``; none for ``obj.attr``/``x[i]``."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in target_names(element.value)]
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


class _Binder(TreeReader):
    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.declared: set[str] = set()  # global / nonlocal: not local

    def _targets(self, node: cst.BaseExpression) -> None:
        self.bound.update(target_names(node))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.bound.add(node.name.value)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.bound.add(node.name.value)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_ListComp(self, node: cst.ListComp) -> bool:
        return False

    def visit_SetComp(self, node: cst.SetComp) -> bool:
        return False

    def visit_DictComp(self, node: cst.DictComp) -> bool:
        return False

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._targets(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._targets(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._targets(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._targets(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._targets(node.asname.name)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._targets(node.name.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._targets(node.target)

    def visit_Global(self, node: cst.Global) -> None:
        self.declared.update(item.name.value for item in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.declared.update(item.name.value for item in node.names)


def local_names(function: cst.FunctionDef) -> frozenset[str]:
    """The names ``function`` binds locally: parameters, assignment, ``for``/``with``/``except`` targets,
    walrus targets, nested ``def``/``class`` names; minus ``global``/``nonlocal`` declarations."""
    binder = _Binder()
    params = function.params
    for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
        binder.bound.add(param.name.value)
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            binder.bound.add(star.name.value)
    function.body.visit(binder)
    return frozenset(binder.bound - binder.declared)


# type parameters bind names too (``def f[T](x: T)``, Python 3.12)
TYPE_PARAMS: tuple[type, ...] = tuple(
    getattr(ast, kind) for kind in ("TypeVar", "ParamSpec", "TypeVarTuple") if hasattr(ast, kind)
)


def bindings_of(node: ast.AST) -> list[str]:
    """The names one stdlib node binds other than by an import: a ``Name`` store or delete, definitions,
    parameters, ``except ... as``, ``global``/``nonlocal``, match captures, type parameters."""
    if isinstance(node, ast.Name):
        return [] if isinstance(node.ctx, ast.Load) else [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return [node.name] if node.name else []
    if isinstance(node, TYPE_PARAMS):
        return [cast(Any, node).name]  # the classes exist from 3.12 only: typeshed for 3.10 has no ``name``
    if isinstance(node, ast.MatchMapping):
        return [node.rest] if node.rest else []
    return []


# the node types :func:`bindings_of` finds names in (a parsed tree holds these exact classes, never subclasses): a
# whole-tree walk asks it only about these, not about every expression node
_BINDERS: frozenset[type] = frozenset(
    {
        ast.Name, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.arg, ast.Global, ast.Nonlocal,
        ast.ExceptHandler, ast.MatchAs, ast.MatchStar, ast.MatchMapping, *TYPE_PARAMS,
    }
)  # fmt: skip


def bound_anywhere(tree: ast.Module) -> frozenset[str]:
    """Every name the module binds anywhere, in any scope, other than by an import (:func:`bindings_of`): a
    superset of every function's local names, read off the stdlib tree in one walk. A name outside it is no
    function's local, so the libcst walk of :func:`local_names` (the costly part of resolving names in big files)
    is needed only for the few names inside it. Names, most of the nodes, are judged here without a call."""
    names: set[str] = set()
    for node in nodes(tree):
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                names.add(node.id)
        elif type(node) in _BINDERS:
            names.update(bindings_of(node))
    return frozenset(names)
