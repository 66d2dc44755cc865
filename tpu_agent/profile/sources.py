"""Where a tensor that changes shape comes from, read statically from the user's source, and the padding edit.

A recompile or a changing-shape finding is only actionable at the line that *creates* the tensor (a batch
built with a new length, a ``for tokens in loader`` with a ragged last batch); the compile site or the model
call only says where it hurts. The capture records the call and compile lines and which dimension changed;
this module finds the assignment that feeds them (the latest one before the call, in the same function) and
writes the edit that pads that dimension up to a bucket, so every step sees one of a few shapes.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from tpu_agent.fsutil import read_regular
from tpu_agent.profile import patches, placement
from tpu_agent.profile.patches import MAX_SOURCE_BYTES

_GUARD = re.compile(
    r"tensor '(?:[A-Za-z_]\w*\[')?(?P<name>[A-Za-z_]\w*)'?\]?' size mismatch at index (?P<dim>\d+)\. "
    r"expected (?P<expected>\d+), actual (?P<actual>\d+)"
)


@dataclass(frozen=True)
class ShapeGuard:
    """A failed shape guard: the compiled function's argument, the dimension, and the two sizes."""

    argument: str
    dim: int
    sizes: tuple[int, int]


@dataclass(frozen=True)
class TensorOrigin:
    """The line that creates the changing tensor (``variable`` = its name there) and the line that uses it."""

    line: int
    use_line: int
    variable: str | None


def parse_guard(reason: str) -> ShapeGuard | None:
    """``"tensor 'x' size mismatch at index 0. expected 16, actual 24"`` (Dynamo's guard text) -> its parts."""
    match = _GUARD.search(reason)
    if match is None:
        return None
    return ShapeGuard(match["name"], int(match["dim"]), (int(match["expected"]), int(match["actual"])))


@functools.lru_cache(maxsize=32)
def read_source(path: str) -> str | None:
    """The text of the user's file (cached: several rules read the same one); ``None`` when unreadable."""
    try:
        return read_regular(Path(path), limit=MAX_SOURCE_BYTES, follow_symlinks=True).decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return None


@functools.lru_cache(maxsize=32)
def parse_source(path: str) -> ast.Module | None:
    """The syntax tree of :func:`read_source`; ``None`` when unreadable or not Python."""
    text = read_source(path)
    if text is None:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def scope_of(tree: ast.Module, line: int) -> ast.AST:
    """The innermost function containing ``line`` (the module when none)."""
    scope: ast.AST = tree
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        inside = node.lineno <= line <= (node.end_lineno or 0)
        if inside and (isinstance(scope, ast.Module) or node.lineno >= getattr(scope, "lineno", 0)):
            scope = node
    return scope


def function_at(path: str, line: int) -> str:
    """The name of the innermost function around ``line`` (``<module>`` at top level, ``<unknown>`` unreadable)."""
    tree = parse_source(path)
    if tree is None:
        return "<unknown>"
    scope = scope_of(tree, line)
    return scope.name if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else "<module>"


def dotted_name(node: ast.AST) -> str | None:
    """``torch.amp.autocast`` for that attribute chain (or a bare name); ``None`` when it is not one (a call's
    result, a subscript): how the fix generators recognise a callee whatever module alias spelled it."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def own_nodes(scope: ast.AST) -> list[ast.AST]:
    """Nodes of ``scope`` outside nested functions and classes (their names are another scope's)."""
    found: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _assigned_before(scope: ast.AST, name: str, line: int) -> int | None:
    """The latest line before ``line`` that binds ``name`` in ``scope`` (an assignment, a ``for`` target, a
    ``with ... as``)."""
    lines = [
        n.lineno for n in own_nodes(scope) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
    ]
    before = [n for n in lines if n < line]
    return max(before) if before else None


def _calls_on(tree: ast.Module, line: int) -> list[ast.Call]:
    """The calls in the statement that starts (or sits) at ``line``."""
    statements = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.stmt) and n.lineno <= line <= (n.end_lineno or n.lineno) and not hasattr(n, "body")
    ]
    if not statements:
        return []
    statement = max(statements, key=lambda n: n.lineno)
    return [n for n in ast.walk(statement) if isinstance(n, ast.Call)]


def _argument_names(call: ast.Call) -> list[str]:
    return [
        n.id
        for arg in [*call.args, *(k.value for k in call.keywords)]
        for n in ast.walk(arg)
        if isinstance(n, ast.Name)
    ]


def origin_of_call_inputs(path: str, line: int) -> TensorOrigin | None:
    """For a model call at ``line`` (eager code): the nearest line before it that creates one of its inputs."""
    tree = parse_source(path)
    if tree is None:
        return None
    scope = scope_of(tree, line)
    best: TensorOrigin | None = None
    for call in _calls_on(tree, line):
        for name in _argument_names(call):
            created = _assigned_before(scope, name, line)
            if created is not None and (best is None or created > best.line):
                best = TensorOrigin(created, line, name)
    return best


def _parameters(tree: ast.Module, function: str) -> list[str] | None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return [a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]]
    return None


def origin_of_argument(path: str, function: str, argument: str) -> TensorOrigin | None:
    """For a compiled ``function`` whose ``argument`` changed shape: the line that creates what a call passes.

    The first call of ``function`` in the file that passes that argument is followed back to the latest
    assignment of the name it passes; an expression passed directly is created on the call line itself.
    """
    tree = parse_source(path)
    parameters = _parameters(tree, function) if tree is not None else None
    if tree is None or parameters is None or argument not in parameters:
        return None
    index = parameters.index(argument)
    for call in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: n.lineno):
        callee = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
        if callee != function:
            continue
        passed = next((k.value for k in call.keywords if k.arg == argument), None)
        if passed is None and index < len(call.args) and not isinstance(call.args[index], ast.Starred):
            passed = call.args[index]
        if passed is None:
            continue
        if isinstance(passed, ast.Name):
            created = _assigned_before(scope_of(tree, call.lineno), passed.id, call.lineno)
            return TensorOrigin(created or call.lineno, call.lineno, passed.id)
        return TensorOrigin(call.lineno, call.lineno, None)
    return None


def bucket_for(sizes: list[int]) -> int:
    """A padding multiple that turns ``sizes`` into few shapes: the next power of two up to 128, then 128s."""
    largest = max(max(sizes), 1)
    return min(128, 1 << (largest - 1).bit_length())


def pad_statement(variable: str, dim: int, bucket: int, rank: int | None) -> str:
    """``x = torch.nn.functional.pad(x, (...))`` padding dimension ``dim`` of ``x`` up to a multiple of ``bucket``.

    ``F.pad`` lists pads from the last dimension backwards; without a known rank the tuple is built from
    ``x.dim()`` so the statement is right for any rank.
    """
    last = f"0, -{variable}.shape[{dim}] % {bucket}"
    if rank is not None and rank > dim:
        pads = f"({'0, 0, ' * (rank - 1 - dim)}{last})"
    else:
        pads = f"(0, 0) * ({variable}.dim() - {dim + 1}) + ({last})"
    return f"{variable} = torch.nn.functional.pad({variable}, {pads})  # pad dim {dim} to a multiple of {bucket}; mask the padding"


def padding_diff(path: str, origin: TensorOrigin, dim: int, sizes: list[int], rank: int | None = None) -> str | None:
    """The diff that pads the changing tensor right after the line that creates it (``None`` when unnamed); when
    that line sits in a branch the use does not (``if crop: x = x[:, :n]``), after that whole statement, so the
    padding runs on every path to the use."""
    if origin.variable is None:
        return None
    statement = pad_statement(origin.variable, dim, bucket_for(sizes), rank)
    tree = parse_source(path)
    body = getattr(scope_of(tree, origin.line), "body", None) if tree is not None else None
    outer = placement.hoisted(body, origin.line, origin.use_line) if isinstance(body, list) else None
    if outer is None:
        return patches.insert_after_statement(path, origin.line, statement)
    return patches.insert_after_block(path, outer.lineno, outer.end_lineno or outer.lineno, statement)
