"""What a name the rules meet holds: the statement just before that binds it, or every binding in the module.

Two questions with two reaches. :func:`bound_earlier` reads the straight-line code before the current
statement in its own block (a function's, a class's, a compound statement's, or the module's): nanoGPT's
``device = f"cuda:{rank}"`` then ``torch.cuda.set_device(device)``; :func:`earlier_in_scope` goes on through
the enclosing blocks, to what has always run before (a seeding call above an ``if``). :func:`always_bound_to_call` asks the
module-wide :mod:`~tpu_agent.migrate.analysis.bindings` whether *every* binding of a name or attribute is one
call, which is what a read in another scope needs: a module global read inside a function, ``self.props`` set in
``__init__`` and read in another method, a class attribute read as ``self.X``; :func:`alias_of` asks the same
of a function held under another name (``set_dev = torch.cuda.set_device``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.analysis.bindings import dotted
from tpu_agent.migrate.analysis.valueflow import attr_key, name_key

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext


def _earlier_in_block(ctx: PyContext, depth: int) -> Iterator[cst.BaseStatement | None]:
    """The statements before ``ctx.stmt_stack[depth]`` in the block holding it, nearest first: the module's
    body at depth 0, else the body of the statement around it (nothing when it sits in an ``else``, a handler
    or a ``finally``, whose earlier statements need not have run).

    None ends the walk: in a module the gate reduced, an inert top-level statement is a stub standing for code
    that cannot be read, so the walk stops there and asks for the file to be migrated again from its full parse
    (``ctx.needs_full_parse``), where every statement is there to read."""
    if depth >= 1:
        block = getattr(ctx.stmt_stack[depth - 1], "body", None)
        statements = getattr(block, "body", ())
        position = next((i for i, statement in enumerate(statements) if statement is ctx.stmt_stack[depth]), 0)
    else:
        statements, position = ctx.module_body, ctx.top_index
    for statement in reversed(statements[:position]):
        if depth == 0 and ctx.reduced and id(statement) in ctx.inert_statements:
            ctx.needs_full_parse = True
            yield None
            return
        yield statement


def earlier_small_statements(ctx: PyContext) -> Iterator[cst.BaseSmallStatement]:
    """The simple statements before the current statement in its enclosing block, nearest first (the module's
    body at module level)."""
    if not ctx.stmt_stack:
        return
    for statement in _earlier_in_block(ctx, len(ctx.stmt_stack) - 1):
        if statement is None:
            return
        if isinstance(statement, cst.SimpleStatementLine):
            yield from reversed(statement.body)


def earlier_in_scope(ctx: PyContext) -> Iterator[cst.BaseStatement]:
    """The statements that have always run when the current one runs, nearest first: the earlier ones of its
    block, then of each enclosing block before the compound statement that holds it, up to the function or
    class (or the module) it is in, or the loop: a statement in a loop body runs again after the code of the
    iteration, which statements before the loop ran before only once. build-nanogpt seeds with
    ``torch.manual_seed(1337)`` and then, under ``if torch.cuda.is_available():``, with
    ``torch.cuda.manual_seed(1337)``: the first has always run when the second does."""
    for depth in range(len(ctx.stmt_stack) - 1, -1, -1):
        for statement in _earlier_in_block(ctx, depth):
            if statement is None:
                return
            yield statement
        if depth >= 1 and isinstance(ctx.stmt_stack[depth - 1], _SCOPE_ENDS):
            return


_SCOPE_ENDS = (cst.FunctionDef, cst.ClassDef, cst.For, cst.While)


def bound_earlier(ctx: PyContext, name: str) -> cst.BaseExpression | None:
    """The value the nearest earlier statement of the enclosing block assigns to ``name`` (None if none does).

    nanoGPT's DDP setup is ``device = f'cuda:{ddp_local_rank}'`` then ``torch.cuda.set_device(device)`` (in
    an ``if``, or at module level): the device string loses its index (TPU102), so set_device_index(device)
    would raise on CUDA; the index the string named is what the call needs."""
    for small in earlier_small_statements(ctx):
        if not isinstance(small, cst.Assign) or len(small.targets) != 1:
            continue
        target = small.targets[0].target
        if isinstance(target, cst.Name) and target.value == name:
            return small.value
    return None


def key_of(target: cst.BaseExpression) -> tuple[str, str] | None:
    """(value-flow and bindings key, the bare name) of a name or attribute (an assignment target, a read):
    ``name:x`` for ``x``, ``attr:x`` for ``a.b.x``."""
    if isinstance(target, cst.Name):
        return name_key(target.value), target.value
    if isinstance(target, cst.Attribute):
        return attr_key(target.attr.value), target.attr.value
    return None


def alias_of(ctx: PyContext, node: cst.BaseExpression) -> str | None:
    """The qualified name of the function a name or attribute is an alias of: every binding of it in the
    module is a reference to that one function (``set_dev = torch.cuda.set_device``, ``self.bind =
    set_device`` after ``from torch.cuda import set_device``). None when a binding holds anything else (an
    import binds the name itself, which :meth:`PyContext.qualname` resolves), or there is none."""
    key = key_of(node)
    if key is None:
        return None
    found = {_reference(ctx, value) for value in ctx.bindings.of(key[0])}
    return found.pop() if len(found) == 1 else None


def _reference(ctx: PyContext, value: ast.expr | None) -> str | None:
    name = dotted(value) if isinstance(value, (ast.Name, ast.Attribute)) else None
    return ctx.resolve(name) if name is not None else None


def always_bound_to_call(ctx: PyContext, node: cst.BaseExpression, qualname: str) -> bool:
    """Whether ``node`` (a name, or an attribute of any object) holds what a call of ``qualname`` returned:
    every binding of it in the module is such a call, and there is at least one."""
    key = key_of(node)
    if key is None:
        return False
    values = ctx.bindings.of(key[0])
    return bool(values) and all(_is_call_of(ctx, value, qualname) for value in values)


def _is_call_of(ctx: PyContext, value: ast.expr | None, qualname: str) -> bool:
    if not isinstance(value, ast.Call):
        return False
    function = dotted(value.func)
    return function is not None and ctx.resolve(function) == qualname
