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
from tpu_agent.profile.model import AgentChange, Location
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
    """The line that creates the changing tensor (``variable`` = its name there), the line that uses it, and the
    value that drives its size (``seq`` in ``tokens = torch.randint(0, V, (8, seq))``, the loader of ``for tokens
    in loader:``) with the line that binds it, when one is read there."""

    line: int
    use_line: int
    variable: str | None
    driver: str | None = None
    driver_line: int | None = None


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


def _statement_at(tree: ast.Module, line: int) -> ast.stmt | None:
    """The innermost simple statement (or block header) that starts at or spans ``line``."""
    statements = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.stmt)
        and n.lineno <= line <= (n.end_lineno or n.lineno)
        and (not hasattr(n, "body") or n.lineno == line)
    ]
    return max(statements, key=lambda n: n.lineno) if statements else None


def _callables(scope: ast.AST) -> set[str]:
    """Names called somewhere in ``scope`` (``model(x)``, ``step_fn(t)``): modules and functions, never the tensor
    whose shape changes."""
    return {n.func.id for n in ast.walk(scope) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


# Keywords that place or type a tensor: the names passed there do not drive its size.
_PLACEMENT_METHODS = frozenset({"to", "cuda", "type", "pin_memory"})  # ``x.to(device)``: device places, not sizes
_PLACEMENT_KEYWORDS = frozenset({"device", "dtype", "generator", "layout", "requires_grad", "pin_memory", "out"})


def _argument_names(call: ast.Call) -> list[str]:
    """Names passed directly as the call's arguments (not names inside a lambda or another call's callee)."""
    names = []
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        if isinstance(arg, ast.Starred):
            arg = arg.value
        if isinstance(arg, ast.Name):
            names.append(arg.id)
    return names


def _driver(tree: ast.Module, scope: ast.AST, line: int, variable: str) -> tuple[str, int] | None:
    """The value that drives the size of what the statement at ``line`` creates: for ``for x in loader:`` the
    loader, else the latest-bound name its value reads (not a callee, not a device or dtype, not ``variable``)."""
    statement = _statement_at(tree, line)
    if isinstance(statement, (ast.For, ast.AsyncFor)):
        iterable = statement.iter
        while isinstance(iterable, ast.Call) and iterable.args:  # enumerate(loader), tqdm(loader)
            iterable = iterable.args[0]
        if isinstance(iterable, ast.Name):
            bound = _assigned_before(scope, iterable.id, line)
            return (iterable.id, bound) if bound is not None else None
        return None
    value = getattr(statement, "value", None)
    if value is None:
        return None
    skipped = {  # a bare callee (``make_batch(seq)``) and what places or types the tensor; ``tokens.to(...)`` reads tokens
        id(n)
        for call in ast.walk(value)
        if isinstance(call, ast.Call)
        for node in [
            *([call.func] if isinstance(call.func, ast.Name) else []),
            *(k.value for k in call.keywords if k.arg in _PLACEMENT_KEYWORDS),
            *(call.args if isinstance(call.func, ast.Attribute) and call.func.attr in _PLACEMENT_METHODS else []),
        ]
        for n in ast.walk(node)
    }
    callables = _callables(scope)
    best: tuple[str, int] | None = None
    for node in ast.walk(value):
        if not isinstance(node, ast.Name) or id(node) in skipped or node.id in callables:
            continue
        bound = _assigned_before(scope, node.id, line)
        if bound is not None and (best is None or bound > best[1]):
            best = (node.id, bound)
    return best


def _origin(tree: ast.Module, scope: ast.AST, name: str, line: int, use_line: int) -> TensorOrigin | None:
    created = _assigned_before(scope, name, line)
    if created is None:
        return None
    driver = _driver(tree, scope, created, name)
    return TensorOrigin(created, use_line, name, *(driver or (None, None)))


def _enclosing_callable(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | None:
    """The innermost function or lambda around ``line``."""
    found = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if node.lineno <= line <= (node.end_lineno or node.lineno) and (
                found is None or node.lineno >= found.lineno
            ):
                found = node
    return found


def _parameter_names(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    arguments = function.args
    return [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]


def _names_of(tree: ast.Module, function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """The names a script calls ``function`` by: its ``def`` name, and any name bound to a value that holds it
    (``step_fn = torch.compile(lambda t: ...)``, ``compiled = torch.compile(train_step)``)."""
    names = {function.name} if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        holds = any(
            n is function or (isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load))
            for n in ast.walk(node.value)
        )
        if holds:
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _first_call_passing(
    tree: ast.Module, function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, argument: str
) -> tuple[ast.Call, ast.expr] | None:
    """The first call (by line) of ``function`` under any name it is bound to that passes ``argument``, and the
    expression it passes there."""
    parameters = _parameter_names(function)
    if argument not in parameters:
        return None
    index = parameters.index(argument)
    names = _names_of(tree, function)
    for call in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: n.lineno):
        callee = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
        if callee not in names:
            continue
        passed = next((k.value for k in call.keywords if k.arg == argument), None)
        if passed is None and index < len(call.args) and not isinstance(call.args[index], ast.Starred):
            passed = call.args[index]
        if passed is not None:
            return call, passed
    return None


def _through_callers(
    tree: ast.Module, function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, argument: str
) -> TensorOrigin | None:
    """For a parameter of a function (or a compiled lambda): the first call that passes it, followed back to the
    line that creates what it passes; an expression passed directly is created on the call line itself."""
    found = _first_call_passing(tree, function, argument)
    if found is None:
        return None
    call, passed = found
    if isinstance(passed, ast.Name):
        origin = _origin(tree, scope_of(tree, call.lineno), passed.id, call.lineno, call.lineno)
        return origin or TensorOrigin(call.lineno, call.lineno, passed.id)
    return TensorOrigin(call.lineno, call.lineno, None)


def origin_of_call_inputs(path: str, line: int) -> TensorOrigin | None:
    """For a model call at ``line``: the nearest line before it that creates one of its tensor inputs.

    Only names passed directly as arguments count, and never a name the script calls (the model, a compiled
    step): padding ``model`` is what this once suggested for ``torch.compile(lambda t: model(t))``. When the input is
    a parameter of the function or lambda around the call, the tensor is the one its caller passes."""
    tree = parse_source(path)
    if tree is None:
        return None
    scope = scope_of(tree, line)
    statement = _statement_at(tree, line)
    if statement is None:
        return None
    enclosing = _enclosing_callable(tree, line)
    callables = _callables(tree)
    best: TensorOrigin | None = None
    for call in (n for n in ast.walk(statement) if isinstance(n, ast.Call)):
        for name in _argument_names(call):
            if name in callables:
                continue
            if enclosing is not None and name in _parameter_names(enclosing):
                found = _through_callers(tree, enclosing, name)
            else:
                found = _origin(tree, scope, name, line, line)
            if found is not None and (best is None or found.line > best.line):
                best = found
    return best


def _compiled_function(
    tree: ast.Module, function: str, argument: str, line: int | None
) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | None:
    """The function Dynamo names: a ``def`` called ``function``, or for ``<lambda>`` the lambda at ``line`` (the
    compile site) that takes ``argument``."""
    found = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return node
        if (
            function == "<lambda>"
            and isinstance(node, ast.Lambda)
            and line is not None
            and node.lineno <= line <= (node.end_lineno or node.lineno)
            and argument in _parameter_names(node)
        ):
            found = node
    return found


def origin_of_argument(path: str, function: str, argument: str, line: int | None = None) -> TensorOrigin | None:
    """For a compiled ``function`` whose ``argument`` changed shape: the line that creates what a call passes.

    ``function`` is the name Dynamo reports: a ``def``'s name, or ``<lambda>`` for a compiled lambda, found at
    ``line`` (the compile site)."""
    tree = parse_source(path)
    target = _compiled_function(tree, function, argument, line) if tree is not None else None
    return _through_callers(tree, target, argument) if tree is not None and target is not None else None


@dataclass(frozen=True)
class ScalarArgument:
    """A Python number passed to a compiled function: the line of the expression as written, the expression and its
    column there (so an edit replaces that occurrence, not the same letters inside another name), and a tensor
    argument of the same call whose device the number can be put on."""

    line: int
    expression: str
    tensor: str | None
    column: int


def scalar_argument(path: str, function: str, argument: str, line: int | None = None) -> ScalarArgument | None:
    """The first call of compiled ``function`` passing ``argument`` (a value Dynamo guarded on as a constant)."""
    tree, text = parse_source(path), read_source(path)
    target = _compiled_function(tree, function, argument, line) if tree is not None else None
    found = _first_call_passing(tree, target, argument) if tree is not None and target is not None else None
    if found is None or text is None:
        return None
    call, passed = found
    expression = ast.get_source_segment(text, passed)
    if expression is None or "\n" in expression:
        return None
    others = [
        a.id for a in [*call.args, *(k.value for k in call.keywords)] if isinstance(a, ast.Name) and a is not passed
    ]
    prefix = text.splitlines()[passed.lineno - 1].encode("utf-8")[: passed.col_offset]  # ast's offsets are bytes
    column = len(prefix.decode("utf-8", errors="replace"))
    return ScalarArgument(passed.lineno, expression, others[0] if others else None, column)


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


def origin_locations(path: str, origin: TensorOrigin) -> list[Location]:
    """The line creating the changing tensor, then the line binding the value that drives its size (if any)."""
    locations = [Location(path, origin.line, function_at(path, origin.line))]
    if origin.driver and origin.driver_line is not None:
        locations.append(Location(path, origin.driver_line, function_at(path, origin.driver_line)))
    return locations


def shape_change(
    path: str, origin: TensorOrigin, dim: int, sizes: list[int], rank: int | None = None, what: str | None = None
) -> tuple[list[Location], AgentChange]:
    """The locations of a changing shape (:func:`origin_locations`) and the padding change, for SH-1 and CO-1
    alike."""
    locations = origin_locations(path, origin)
    name = f"`{origin.variable}`" if origin.variable else (what or "the tensor")
    source = f"created at line {origin.line}"
    if origin.driver and origin.driver_line is not None:
        source += f", its size from `{origin.driver}` (line {origin.driver_line})"
    bucket = bucket_for(sizes)
    change = AgentChange(
        f"{name} ({source}) takes sizes {', '.join(map(str, sizes[:8]))} in dim {dim}: pad that dim to a multiple "
        f"of {bucket} right after it is created (and mask the padding in the loss), or bucket the data to a few "
        "fixed sizes, so every step sees one shape.",
        padding_diff(path, origin, dim, sizes, rank),
    )
    return locations, change
