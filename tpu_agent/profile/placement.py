"""Where an inserted statement runs on every path: block levels read from the syntax tree.

An edit that adds a line (``model = torch.compile(model)``, a padding statement) is only right at a level
that runs whenever the line it follows ran and before the line it serves: nanoGPT builds its model in
``if init_from == 'scratch': ... elif init_from == 'resume': ...`` and wraps it in ``if ddp:``, so "after
the last ``model = ...``" by indentation lands in a branch that runs only sometimes. These helpers follow
the nested statement lists instead: the chain of statements around a line, the level two lines share,
and whether a statement rebinds a name on every path.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

# A function or class body is another scope: its statements do not run where it is defined.
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _bodies(statement: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested directly in ``statement`` (branches, loop bodies, handlers, cases)."""
    bodies = [getattr(statement, name) for name in ("body", "orelse", "finalbody") if hasattr(statement, name)]
    bodies += [handler.body for handler in getattr(statement, "handlers", [])]
    bodies += [case.body for case in getattr(statement, "cases", [])]
    return [body for body in bodies if isinstance(body, list)]


def _contains(statement: ast.stmt, line: int) -> bool:
    return statement.lineno <= line <= (statement.end_lineno or statement.lineno)


def chain(body: list[ast.stmt], line: int) -> list[tuple[list[ast.stmt], int]]:
    """The statement lists from ``body`` inwards, each with the index of its statement that holds ``line``;
    stops at a nested function or class (its body is another scope)."""
    found: list[tuple[list[ast.stmt], int]] = []
    candidates = [body]
    while candidates:
        level = next(
            ((stmts, index) for stmts in candidates for index, s in enumerate(stmts) if _contains(s, line)), None
        )
        if level is None:
            break
        found.append(level)
        statement = level[0][level[1]]
        candidates = [] if isinstance(statement, _SCOPES) else _bodies(statement)
    return found


def common_level(body: list[ast.stmt], first: int, second: int) -> tuple[list[ast.stmt], int, int] | None:
    """The innermost statement list holding both lines, with the indices of the statements that hold each."""
    a, b = chain(body, first), chain(body, second)
    shared = None
    for (stmts_a, index_a), (stmts_b, index_b) in zip(a, b, strict=False):
        if stmts_a is not stmts_b:
            break
        shared = (stmts_a, index_a, index_b)
        if index_a != index_b:
            break
    return shared


def binds(target: ast.expr, name: str) -> bool:
    """Whether the assignment target ``target`` rebinds ``name`` itself (not an attribute or item of it)."""
    if isinstance(target, ast.Name):
        return target.id == name
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(binds(element, name) for element in target.elts)
    return False


def rebinds_on_every_path(statements: Sequence[ast.stmt], name: str) -> bool:
    """Whether running ``statements`` always ends with ``name`` bound by one of them (an ``if`` counts when
    every branch, ``else`` included, does)."""
    for statement in statements:
        if isinstance(statement, ast.Assign) and any(binds(t, name) for t in statement.targets):
            return True
        if isinstance(statement, (ast.AnnAssign, ast.AugAssign)) and statement.value and binds(statement.target, name):
            return True
        if isinstance(statement, (ast.With, ast.AsyncWith)) and rebinds_on_every_path(statement.body, name):
            return True
        if (
            isinstance(statement, ast.If)
            and rebinds_on_every_path(statement.body, name)
            and rebinds_on_every_path(statement.orelse, name)
        ):
            return True
    return False


def calls_method_of(statement: ast.stmt, name: str) -> bool:
    """Whether ``statement`` is a bare ``name.method(...)`` call (``model.to(device)``, ``model.cuda()``)."""
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Call)
        and isinstance(statement.value.func, ast.Attribute)
        and isinstance(statement.value.func.value, ast.Name)
        and statement.value.func.value.id == name
    )


def hoisted(body: list[ast.stmt], line: int, use_line: int) -> ast.stmt | None:
    """When ``line`` sits in a branch that need not run on the way to ``use_line`` (``if pad: x = ...`` and
    then ``model(x)``), the statement at the level both share that holds it: an edit meant for every path
    goes after that one. ``None`` when ``line`` is already at that level (or the header that opens it)."""
    shared = common_level(body, line, use_line)
    if shared is None:
        return None
    stmts, index, use_index = shared
    statement = stmts[index]
    if index == use_index or statement.lineno == line:
        return None
    return statement
