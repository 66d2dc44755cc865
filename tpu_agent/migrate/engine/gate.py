"""The statement gate: top-level statements whose text holds no trigger for any rule are neither parsed by
libcst nor visited.

Most statements of a real file have nothing CUDA-ish in them; the stdlib parser (much faster than a
libcst parse) gives each statement's line span, and a statement whose text the prefilter regex (plus the
file's own aliases of CUDA modules) does not match is inert. :func:`reduce_source` replaces every inert
top-level statement by a stub of the same height (``(`` ... ``)``), so libcst parses only what the rules
can act on while every line keeps its number; the splicer copies the inert statements' original text back.
:func:`statement_map` marks inert statements (stubs included) so the rule pass skips their subtrees, and
gives the first line of every top-level statement, which the splicer's layout needs.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from tpu_agent.migrate.analysis.astnodes import nodes
from tpu_agent.migrate.analysis.valueflow import call_name
from tpu_agent.migrate.engine.positions import NEWLINE_RE, line_starts
from tpu_agent.migrate.engine.prefilter import CUDA_TOKENS, lower_search

_IMPORT_RE = re.compile(r"\bimport\b")
# functions that bind a process to a device (torch.cuda's and torch.accelerator's), held under other names
_BIND_FUNCTIONS = frozenset({"set_device", "set_device_index", "set_device_idx"})
# calls whose result is held and read under the name it is bound to
_HELD_CALLS = frozenset({"get_device_properties", "current_accelerator"})
# dtypes a name holds for a later cast (``dtype = torch.float16`` then ``.to(dtype)``: TPU304 reports the cast)
_HELD_DTYPES = frozenset({"float16", "half"})
_HELD_TRIGGERS = ("set_device", *_HELD_CALLS, *_HELD_DTYPES)
_PAIRS: dict[type, tuple[type, ...]] = {
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: (ast.ClassDef,),
    cst.If: (ast.If,),
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: (ast.While,),
    cst.With: (ast.With, ast.AsyncWith),
    cst.Try: (ast.Try,),
    cst.Match: (ast.Match,),
}
if sys.version_info >= (3, 11):  # except* exists from Python 3.11 (the package supports 3.10)
    _PAIRS[cst.TryStar] = (ast.TryStar,)


def _cuda_aliases(tree: ast.Module) -> list[str]:
    """Names bound by the file's imports to CUDA-ish things (``tc`` in ``import torch.cuda as tc``)."""
    names = []
    statements = list(tree.body)
    for node in tree.body:
        if isinstance(node, (ast.Try, ast.If)):
            statements.extend(node.body)
    for node in statements:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and lower_search(CUDA_TOKENS, alias.name.encode()):
                    names.append(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if lower_search(CUDA_TOKENS, f"{node.module}.{alias.name}".encode()):
                    names.append(alias.asname or alias.name)
    return names


def _holders(tree: ast.Module, source: str) -> list[str]:
    """Names and attributes some assignment binds to a CUDA-ish thing that later statements use without naming
    it: ``get_device_properties(...)`` (``if PROPS.major >= 8``, ``self.props.minor``: TPU208 reports the read), a
    device-binding function (``set_dev = torch.cuda.set_device``: TPU201 guards ``set_dev(rank)``) or the
    accelerator (``acc = torch.accelerator.current_accelerator()``: TPU107 rewrites ``f"{acc}:{rank}"``) or a float16
    dtype (``dtype = torch.float16``: TPU304 reports ``x.to(dtype)``)."""
    if not any(name in source for name in _HELD_TRIGGERS):
        return []
    names: list[str] = []
    for node in nodes(tree):
        if isinstance(node, ast.Assign) and _holds_trigger(node.value):
            for target in node.targets:
                if isinstance(target, (ast.Name, ast.Attribute)):
                    names.append(target.id if isinstance(target, ast.Name) else target.attr)
    return names


def _holds_trigger(value: ast.expr) -> bool:
    if isinstance(value, ast.Call):
        return call_name(value) in _HELD_CALLS
    if isinstance(value, ast.IfExp):
        return _holds_trigger(value.body) or _holds_trigger(value.orelse)
    if isinstance(value, ast.Attribute) and value.attr in _HELD_DTYPES:
        return True
    name = value.id if isinstance(value, ast.Name) else value.attr if isinstance(value, ast.Attribute) else ""
    return name in _BIND_FUNCTIONS


def _trigger_gate(tree: ast.Module, source: str) -> re.Pattern[bytes]:
    """The prefilter regex, plus the file's own names for CUDA-ish things; in lower case, for
    :func:`~tpu_agent.migrate.engine.prefilter.lower_search` (identifiers hold no regex escapes, and lower-casing
    their UTF-8 bytes folds exactly what ``re.IGNORECASE`` folds in a bytes pattern: ASCII letters)."""
    aliases = _cuda_aliases(tree) + _holders(tree, source)
    if not aliases:
        return CUDA_TOKENS
    return re.compile(CUDA_TOKENS.pattern + (b"|\\b(?:" + "|".join(map(re.escape, aliases)).encode() + b")\\b").lower())


def _is_live(text: str, gate: re.Pattern[bytes]) -> bool:
    """A statement the rules may act on: it imports (its names resolve the rest) or holds a trigger."""
    return _IMPORT_RE.search(text) is not None or lower_search(gate, text.encode("utf-8", "surrogatepass")) is not None


def _begin(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", None) or []
    return min([stmt.lineno, *(d.lineno for d in decorators)])


@dataclass(frozen=True)
class Reduction:
    """A source whose inert top-level statements are stubs of the same height, and its statement tree."""

    text: str
    tree: ast.Module  # the full tree's statements, a stub ``ast.Expr`` in place of each inert group


_SIMPLE = (
    ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Pass, ast.Delete, ast.Return, ast.Raise, ast.Assert,
    ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Break, ast.Continue,
)  # fmt: skip


@dataclass
class _Group:
    """Top-level statements sharing lines (``a = 1; b = 2``): stubbed together or not at all."""

    begin: int
    end: int
    live: bool
    statements: list[ast.stmt]


def reduce_source(source: str, tree: ast.Module) -> Reduction | None:
    """``source`` with each inert top-level statement replaced by a stub spanning the same lines (each line keeps
    its own line ending), or None when every statement is live. Comments and blank lines between statements
    stay as they are. A simple statement becomes ``(`` ... ``)``, a compound one ``if (`` ... ``): pass``: the
    import placement tells the two apart (imports go after the leading simple statements), and a leading
    docstring is kept (imports go after it)."""
    gate = _trigger_gate(tree, source)
    starts = line_starts(source)
    groups: list[_Group] = []
    for position, stmt in enumerate(tree.body):
        begin, end = _begin(stmt), stmt.end_lineno or stmt.lineno
        docstring = position == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        live = docstring or _is_live(source[starts[begin - 1] : _line_end(starts, end, source)], gate)
        if groups and begin <= groups[-1].end:
            group = groups[-1]
            group.end, group.live = max(group.end, end), group.live or live
            group.statements.append(stmt)
        else:
            groups.append(_Group(begin, end, live, [stmt]))
    if all(group.live for group in groups):
        return None
    parts: list[str] = []
    body: list[ast.stmt] = []
    copied = 0  # offset in ``source`` up to which the text is in ``parts``
    for group in groups:
        if group.live:
            body.extend(group.statements)
            continue
        start, stop = starts[group.begin - 1], _line_end(starts, group.end, source)
        endings = NEWLINE_RE.findall(source, start, stop)
        closing = endings.pop() if len(endings) > group.end - group.begin else ""
        compound = not isinstance(group.statements[0], _SIMPLE)
        parts.append(source[copied:start])
        parts.append(("if (" if compound else "(") + "".join(endings) + ("): pass" if compound else ")") + closing)
        copied = stop
        stub: ast.stmt = (
            ast.If(ast.Tuple([], ast.Load()), [ast.Pass()], []) if compound else ast.Expr(ast.Tuple([], ast.Load()))
        )
        stub.lineno, stub.end_lineno, stub.col_offset, stub.end_col_offset = group.begin, group.end, 0, 1
        body.append(stub)
    parts.append(source[copied:])
    return Reduction("".join(parts), ast.Module(body=body, type_ignores=[]))


def _line_end(starts: list[int], line: int, source: str) -> int:
    """Offset just past line ``line`` (1-based), its line ending included."""
    return starts[line] if line < len(starts) else len(source)


@dataclass
class StatementMap:
    """What the stdlib parser tells about the libcst statements of one module."""

    inert: set[int]  # ids of statements with no trigger for any rule
    begins: list[int] | None  # first line (1-based, decorators included) of each top-level statement
    tree: ast.Module | None = None  # the stdlib parse, reused by the analyses rules ask for (value flow)


def statement_map(module: cst.Module, source: str, tree: ast.Module | None = None) -> StatementMap:
    """Top-level statements (and methods of top-level classes) whose text holds no trigger for any rule,
    and the first line of every top-level statement.

    The stdlib parser gives each statement's line span; the libcst statements are matched to it one to one
    (a ``SimpleStatementLine`` covers as many ast statements as it has small statements). Statements that
    import are always visited (their names resolve the rest). Any mismatch, or code the stdlib parser does
    not accept, disables the gate. ``tree`` is the stdlib parse of ``source`` when the caller has it already
    (:func:`~tpu_agent.migrate.engine.guard.assess`).
    """
    if tree is None:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return StatementMap(set(), None)
    gate = _trigger_gate(tree, source)
    starts = line_starts(source)
    inert: set[int] = set()
    begins: list[int] = []

    def walk(cst_body: Sequence[cst.CSTNode], ast_body: list[ast.stmt], top: bool) -> bool:
        index = 0
        for stmt in cst_body:
            count = len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
            group = ast_body[index : index + count]
            index += count
            if len(group) != count:
                return False
            if not isinstance(stmt, cst.SimpleStatementLine) and not isinstance(group[0], _PAIRS.get(type(stmt), ())):
                return False
            first = group[0]
            begin = _begin(first)
            if top:
                begins.append(begin)
            end = group[-1].end_lineno or first.lineno
            text = source[starts[begin - 1] : _line_end(starts, end, source)]
            if _IMPORT_RE.search(text):
                continue
            if not _is_live(text, gate):
                inert.add(id(stmt))
            elif isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
                if not walk(stmt.body.body, group[0].body, False):  # type: ignore[attr-defined]
                    return False
        return index == len(ast_body)

    if not walk(module.body, tree.body, True):
        return StatementMap(set(), None, tree)
    return StatementMap(inert, begins, tree)
