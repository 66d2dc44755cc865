"""The names a function binds for itself: its parameters and what its body assigns, so that a parameter
``config`` in ``def __init__(self, config)`` is not the module's ``import torch._inductor.config as config``.

Python decides a name's scope per function: a name the function binds anywhere in its body (not declared
``global`` or ``nonlocal``) is local throughout it. Nested ``def``, ``class`` and ``lambda`` bodies and
comprehensions have scopes of their own and are not entered; imports inside the function are left to the
import tracking that reads them.
"""

from __future__ import annotations

import ast

import libcst as cst


class _Binder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.declared: set[str] = set()  # global / nonlocal: not local

    def _targets(self, node: cst.BaseExpression) -> None:
        if isinstance(node, cst.Name):
            self.bound.add(node.value)
        elif isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                self._targets(element.value)
        elif isinstance(node, cst.StarredElement):
            self._targets(node.value)

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


def bound_anywhere(tree: ast.Module) -> frozenset[str]:
    """Every name the module binds anywhere, in any scope, as :func:`local_names` counts bindings (and more): a
    superset of every function's local names, read off the stdlib tree in one walk. A name outside it is no
    function's local, so the libcst walk of :func:`local_names` (the costly part of resolving names in big files)
    is needed only for the few names inside it."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name is not None:
            names.add(node.name)
    return frozenset(names)
