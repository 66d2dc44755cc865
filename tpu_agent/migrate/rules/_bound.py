"""What a name the rules meet holds: the statement just before that binds it, or every binding in the module.

Two questions with two reaches. :func:`bound_earlier` reads the straight-line code before the current
statement in its own block (a function's, a class's, a compound statement's, or the module's): nanoGPT's
``device = f"cuda:{rank}"`` then ``torch.cuda.set_device(device)``. :func:`always_bound_to_call` asks the
module-wide :mod:`~tpu_agent.migrate.analysis.bindings` whether *every* binding of a name or attribute is one
call, which is what a read in another scope needs: a module global read inside a function, ``self.props`` set in
``__init__`` and read in another method, a class attribute read as ``self.X``.
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


def earlier_small_statements(ctx: PyContext) -> Iterator[cst.BaseSmallStatement]:
    """The simple statements before the current statement in its enclosing block, nearest first.

    At module level the block is the module's body. In a module the gate reduced, an inert top-level statement
    is a stub standing for code that cannot be read: the walk ends there and asks for the file to be migrated
    again from its full parse (``ctx.needs_full_parse``), where every statement is there to read."""
    if len(ctx.stmt_stack) >= 2:
        block = getattr(ctx.stmt_stack[-2], "body", None)
        statements = getattr(block, "body", ())
        position = next((i for i, statement in enumerate(statements) if statement is ctx.stmt_stack[-1]), 0)
    elif ctx.stmt_stack:
        statements, position = ctx.module_body, ctx.top_index
    else:
        return
    for statement in reversed(statements[:position]):
        if len(ctx.stmt_stack) == 1 and ctx.reduced and id(statement) in ctx.inert_statements:
            ctx.needs_full_parse = True
            return
        if isinstance(statement, cst.SimpleStatementLine):
            yield from reversed(statement.body)


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


def always_bound_to_call(ctx: PyContext, node: cst.BaseExpression, qualname: str) -> bool:
    """Whether ``node`` (a name, or an attribute of any object) holds what a call of ``qualname`` returned:
    every binding of it in the module is such a call, and there is at least one."""
    if isinstance(node, cst.Name):
        key = name_key(node.value)
    elif isinstance(node, cst.Attribute):
        key = attr_key(node.attr.value)
    else:
        return False
    values = ctx.bindings.of(key)
    return bool(values) and all(_is_call_of(ctx, value, qualname) for value in values)


def _is_call_of(ctx: PyContext, value: ast.expr | None, qualname: str) -> bool:
    if not isinstance(value, ast.Call):
        return False
    function = dotted(value.func)
    return function is not None and ctx.resolve(function) == qualname
