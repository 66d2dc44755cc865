"""The autocast context a line already runs under, and where its dtype comes from, read from the syntax tree.

Scripts such as nanoGPT configure mixed precision once (``ctx = nullcontext() if device_type == 'cpu' else
torch.amp.autocast(device_type=device_type, dtype=ptdtype)``) and run the forward under ``with ctx:``. When
the matmuls there still run in fp32, nesting a second ``torch.autocast`` inside would hide the real cause:
the fix is that context's dtype, often a setting (``dtype = 'bfloat16'``, ``--dtype=bfloat16``). This module
finds the enclosing context, the autocast call behind it, the condition under which it is a
``nullcontext()`` instead, and the dtype expression followed back to a literal or a module-level setting.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tpu_agent.profile.sources import dotted_name, own_nodes, parse_source, read_source, scope_of

AUTOCAST_CALLS = frozenset(
    {
        "autocast",
        "amp.autocast",
        "torch.autocast",
        "torch.amp.autocast",
        "torch.cpu.amp.autocast",
        "torch.cuda.amp.autocast",
    }
)
# The callees whose second positional argument is the dtype (``torch.autocast(device_type, dtype)``).
_DTYPE_SECOND = frozenset({"autocast", "torch.autocast", "torch.amp.autocast", "amp.autocast"})
NULL_CONTEXTS = frozenset({"nullcontext", "contextlib.nullcontext"})
# How many names a context or a dtype may be bound through (``ctx`` -> autocast, ``ptdtype`` -> setting).
_MAX_HOPS = 4


@dataclass(frozen=True)
class Setting:
    """A module-level assignment the autocast dtype derives from (nanoGPT's ``dtype = 'bfloat16' if ...``)."""

    name: str
    line: int
    source: str  # the assigned value as written
    literal: str | None  # the string, when the value is a plain string literal


@dataclass(frozen=True)
class AutocastContext:
    """The autocast a line runs under: the ``with``, the call behind it, and where its dtype is decided."""

    with_line: int
    expression: str  # the ``with`` item as written: ``ctx`` or ``torch.autocast(...)``
    call_line: int
    callee: str  # ``torch.amp.autocast``
    call: str  # the autocast call as written
    dtype: str | None  # the dtype argument as written; None: the device's default autocast dtype
    dtype_literal: str | None  # ``torch.float16`` when the dtype resolves to a torch attribute
    dtype_line: int | None  # where that literal is written (the call, or the assignment of a name it passes)
    setting: Setting | None  # the module-level setting the dtype is looked up from
    fallback: str | None  # the condition under which the context is ``nullcontext()`` instead

    @property
    def resolved_dtype(self) -> str | None:
        """``float16``, ``bfloat16``, ...: the dtype's name when known from a literal or the setting's string."""
        if self.dtype_literal is not None:
            return self.dtype_literal.rsplit(".", 1)[-1]
        return self.setting.literal if self.setting is not None else None


def _is_call_to(node: ast.AST, names: frozenset[str]) -> bool:
    return isinstance(node, ast.Call) and dotted_name(node.func) in names


class _Resolver:
    """Follows names to their latest binding in the line's function, then at module level."""

    def __init__(self, tree: ast.Module, source: str, line: int) -> None:
        self.tree, self.source, self.line = tree, source, line
        self.scope = scope_of(tree, line)

    def text(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ""

    def value_of(self, name: str) -> ast.Assign | None:
        """The assignment ``name = ...`` that the line sees (latest before it in its own function, else the module's
        latest before it, else the module's last)."""
        scopes = [self.scope] if self.scope is self.tree else [self.scope, self.tree]
        for index, scope in enumerate(scopes):
            found = sorted(
                (
                    n
                    for n in own_nodes(scope)
                    if isinstance(n, ast.Assign)
                    and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Name)
                    and n.targets[0].id == name
                ),
                key=lambda n: n.lineno,
            )
            before = [n for n in found if n.lineno < self.line]
            if before:
                return before[-1]
            if found and index == len(scopes) - 1:
                return found[-1]
        return None

    def autocast(self, node: ast.expr, hops: int = 0) -> tuple[ast.Call, str | None] | None:
        """The autocast call ``node`` evaluates to, and the condition under which it is ``nullcontext()``."""
        if isinstance(node, ast.Call) and _is_call_to(node, AUTOCAST_CALLS):
            return node, None
        if isinstance(node, ast.IfExp):
            for chosen, other, negate in ((node.body, node.orelse, True), (node.orelse, node.body, False)):
                if (
                    isinstance(chosen, ast.Call)
                    and _is_call_to(chosen, AUTOCAST_CALLS)
                    and _is_call_to(other, NULL_CONTEXTS)
                ):
                    condition = self.text(node.test)
                    return chosen, f"not ({condition})" if negate else condition
        if isinstance(node, ast.Name) and hops < _MAX_HOPS:
            bound = self.value_of(node.id)
            return self.autocast(bound.value, hops + 1) if bound is not None else None
        return None

    def dtype(self, node: ast.expr, hops: int = 0) -> tuple[ast.expr | None, Setting | None]:
        """The ``torch.<dtype>`` literal behind ``node``, or the module-level setting it is looked up from."""
        if isinstance(node, ast.Attribute) and dotted_name(node) is not None:
            return node, None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name):  # {'bfloat16': ...}[dtype]
            return None, self.setting(node.slice.id)
        if (
            isinstance(node, ast.Call)
            and dotted_name(node.func) == "getattr"
            and len(node.args) == 2
            and isinstance(node.args[1], ast.Name)
        ):  # getattr(torch, dtype)
            return None, self.setting(node.args[1].id)
        if isinstance(node, ast.Name) and hops < _MAX_HOPS:
            bound = self.value_of(node.id)
            if bound is not None:
                return self.dtype(bound.value, hops + 1)
        return None, None

    def setting(self, name: str) -> Setting | None:
        bound = self.value_of(name)
        if bound is None:
            return None
        value = bound.value
        literal = value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
        return Setting(name, bound.lineno, self.text(value), literal)


def _dtype_argument(call: ast.Call, callee: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "dtype":
            return keyword.value
    return call.args[1] if callee in _DTYPE_SECOND and len(call.args) > 1 else None


def _enclosing_withs(tree: ast.Module, line: int) -> list[ast.With | ast.AsyncWith]:
    """The ``with`` statements whose body holds ``line``, innermost first."""
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.With, ast.AsyncWith))
        and node.body[0].lineno <= line <= (node.end_lineno or node.lineno)
    ]
    return sorted(found, key=lambda node: -node.lineno)


def enclosing_autocast(path: str, line: int) -> AutocastContext | None:
    """The autocast context ``line`` of ``path`` runs under (innermost), or ``None`` (none, or unreadable)."""
    tree, text = parse_source(path), read_source(path)
    if tree is None or text is None:
        return None
    resolver = _Resolver(tree, text, line)
    for statement in _enclosing_withs(tree, line):
        for item in statement.items:
            found = resolver.autocast(item.context_expr)
            if found is None:
                continue
            call, fallback = found
            callee = dotted_name(call.func) or "autocast"
            argument = _dtype_argument(call, callee)
            literal, setting = resolver.dtype(argument) if argument is not None else (None, None)
            return AutocastContext(
                with_line=statement.lineno,
                expression=resolver.text(item.context_expr),
                call_line=call.lineno,
                callee=callee,
                call=resolver.text(call),
                dtype=resolver.text(argument) if argument is not None else None,
                dtype_literal=resolver.text(literal) if literal is not None else None,
                dtype_line=literal.lineno if literal is not None else None,
                setting=setting,
                fallback=fallback,
            )
    return None


def setting_seen_at(path: str, name: str, line: int) -> Setting | None:
    """The assignment of ``name`` that ``line`` of ``path`` sees (its function's, else the module's): a switch
    such as nanoGPT's ``compile = True``, which ``--compile=False`` overrides."""
    tree, text = parse_source(path), read_source(path)
    return _Resolver(tree, text, line).setting(name) if tree is not None and text is not None else None
