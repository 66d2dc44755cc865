"""The one libcst pass per Python file: parse, dispatch every node to the rules, finish the module.

Speed matters (thousands of lines per second per core), so the pass avoids libcst's metadata providers:
qualified names come from the file's own imports (:class:`~tpu_agent.migrate.engine.context.PyContext`),
and positions are computed after the pass, only for the nodes that have findings, by one light code
generation that records nothing else. Each node is dispatched by its type to the handlers registered for
it; dotted references (``torch.cuda.synchronize``, ``tc.synchronize`` after ``import torch.cuda as tc``) go
to the reference handler with the longest matching qualified-name prefix.
"""

from __future__ import annotations

import ast
import gc
import re
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst._nodes.internal import CodegenState

from tpu_agent.migrate.engine.context import RESOLVER_COMMENT, PendingFinding, PyContext
from tpu_agent.migrate.engine.prefilter import CUDA_TOKENS
from tpu_agent.migrate.model import MigrateOptions, Rule, Target
from tpu_agent.migrate.rules._base import Family, LeaveFn, RefFn, VisitFn

_COMPOUND = (
    cst.FunctionDef,
    cst.ClassDef,
    cst.If,
    cst.For,
    cst.While,
    cst.With,
    cst.Try,
    cst.TryStar,
    cst.Match,
)
_STATEMENTS = frozenset({cst.SimpleStatementLine, *_COMPOUND})
_CUDA_MODULE_PREFIXES = ("torch.cuda", "torch.backends.cudnn", "torch.backends.cuda")


class ParseFailure(Exception):
    """The file is not Python this tool can parse; ``line``/``column`` are 1-based."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


@dataclass(frozen=True)
class Dispatch:
    """Handlers of every enabled family, indexed by node type (built once per process)."""

    visit: Mapping[type, tuple[VisitFn, ...]]
    leave: Mapping[type, tuple[LeaveFn, ...]]
    references: tuple[tuple[str, str, RefFn], ...]  # (prefix, prefix + ".", handler), longest first

    @classmethod
    def from_families(cls, families: list[Family]) -> Dispatch:
        visit: dict[type, list[VisitFn]] = {}
        leave: dict[type, list[LeaveFn]] = {}
        refs: list[tuple[str, str, RefFn]] = []
        for family in families:
            for vh in family.visit_handlers:
                visit.setdefault(vh.node_type, []).append(vh.fn)
            for lh in family.leave_handlers:
                leave.setdefault(lh.node_type, []).append(lh.fn)
            refs.extend((rh.prefix, rh.prefix + ".", rh.fn) for rh in family.reference_handlers)
        refs.sort(key=lambda item: len(item[0]), reverse=True)
        return cls(
            {k: tuple(v) for k, v in visit.items()}, {k: tuple(v) for k, v in leave.items()}, tuple(refs)
        )

    def reference_handler(self, qualname: str) -> RefFn | None:
        for prefix, prefix_dot, fn in self.references:
            if qualname == prefix or qualname.startswith(prefix_dot):
                return fn
        return None


class _Pass(cst.CSTTransformer):
    def __init__(self, ctx: PyContext, dispatch: Dispatch) -> None:
        super().__init__()
        self.ctx = ctx
        self.dispatch = dispatch
        # (updated) statement lines left empty by a rule, and blocks that hold only the ``pass`` removal put
        # there; by id, holding the nodes so that no other node can take a freed one's id
        self.removed: dict[int, cst.CSTNode] = {}
        self.emptied: dict[int, cst.CSTNode] = {}
        self.elifs: set[int] = set()  # ids of original ``If`` nodes that are the ``elif`` of another
        self.inert: set[int] = set()  # ids of statements whose text has no trigger: not descended into
        self.dirty: set[int] = set()  # indexes of top-level statements something changed in
        self.inserted: tuple[int, int] = (0, 0)  # (index, count) of statements added to the module body
        self.top_removed = False  # a whole top-level statement was removed

    # libcst calls these for every field of every node to look up visit_<Node>_<field> methods; none exist.
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    # Structure the rules rely on, recorded on the way down.
    def on_visit(self, node: cst.CSTNode) -> bool:
        ctx = self.ctx
        kind = type(node)
        if kind is cst.Attribute:
            ctx.not_references.add(id(node.value))
            ctx.not_references.add(id(node.attr))
        elif kind is cst.Call:
            ctx.call_funcs.add(id(node.func))
            for arg in node.args:
                ctx.bare_positions.add(id(arg.value))
                if arg.keyword is not None:
                    ctx.not_references.add(id(arg.keyword))
        elif kind in _STATEMENTS:
            if not ctx.stmt_stack:
                ctx.top_index += 1
            ctx.stmt_stack.append(node)
            if kind is cst.ClassDef:
                ctx.class_stack.append(node.name.value)
            if id(node) in self.inert:
                return False  # no CUDA-ish token in it: nothing for any rule
            if kind is cst.If or kind is cst.While:
                ctx.bare_positions.add(id(node.test))
                if kind is cst.If and isinstance(node.orelse, cst.If):
                    self.elifs.add(id(node.orelse))
            elif kind is cst.FunctionDef:
                ctx.not_references.add(id(node.name))
            elif kind is cst.ClassDef:
                ctx.not_references.add(id(node.name))
        elif kind is cst.Import or kind is cst.ImportFrom:
            ctx.bind_import(node)
            for fn in self.dispatch.visit.get(kind, ()):
                fn(ctx, node)
            return False
        elif kind is cst.Assign:
            for target in node.targets:
                ctx.not_references.add(id(target.target))
            ctx.bare_positions.add(id(node.value))
        elif kind is cst.AugAssign or kind is cst.AnnAssign:
            ctx.not_references.add(id(node.target))
        elif kind is cst.Param:
            ctx.not_references.add(id(node.name))
        elif kind is cst.AsName:
            ctx.not_references.add(id(node.name))
        elif kind is cst.Global or kind is cst.Nonlocal:
            return False
        elif kind is cst.FormattedString:
            ctx.fstring_quotes.append(node.end)
        elif kind is cst.BooleanOperation:
            ctx.bare_positions.add(id(node.left))
            ctx.bare_positions.add(id(node.right))
        elif kind is cst.UnaryOperation and isinstance(node.operator, cst.Not):
            ctx.bare_positions.add(id(node.expression))
        elif kind is cst.Return or kind is cst.Assert:
            inner = node.value if kind is cst.Return else node.test
            if inner is not None:
                ctx.bare_positions.add(id(inner))
        for fn in self.dispatch.visit.get(kind, ()):
            fn(ctx, node)
        return True

    def on_leave(self, original: Any, updated: Any) -> Any:
        ctx = self.ctx
        kind = type(original)
        result = updated
        for fn in self.dispatch.leave.get(kind, ()):
            result = fn(ctx, original, result)
            if type(result) is not kind:
                break
        if (kind is cst.Name or kind is cst.Attribute) and result is updated and id(original) not in ctx.not_references and id(original) not in ctx.claimed:
            qualname = ctx.qualname(original)
            if qualname is not None:
                handler = self.dispatch.reference_handler(qualname)
                if handler is not None:
                    result = handler(ctx, original, result, qualname)
        if kind is cst.FormattedString:
            ctx.fstring_quotes.pop()
        elif kind in _STATEMENTS:
            ctx.stmt_stack.pop()
            if kind is cst.ClassDef:
                ctx.class_stack.pop()
            todos = ctx.todo_comments(original)
            if todos and not isinstance(result, cst.RemovalSentinel):
                result = _with_todos(result, todos)
            if kind is cst.SimpleStatementLine and isinstance(result, cst.SimpleStatementLine) and not result.body:
                result = result.with_changes(body=[cst.Pass()])
                self.removed[id(result)] = result
            elif kind is cst.If and isinstance(result, cst.If):
                result = self._drop_empty_branches(original, result)
        elif kind is cst.SimpleStatementSuite and not result.body:
            result = result.with_changes(body=[cst.Pass()])
            self.emptied[id(result)] = result
        elif kind is cst.IndentedBlock:
            result = self._strip_removed(result, "footer")
        elif kind is cst.Module:
            finished, self.inserted = _finish_module(ctx, original, result)
            result = self._strip_removed(finished, "footer")
            self.top_removed = len(result.body) != len(original.body) + self.inserted[1]
            return result
        if result is not updated:
            self.dirty.add(ctx.top_index)
        return result

    def _strip_removed(self, block: Any, footer_field: str) -> Any:
        """Drop statements a rule emptied, keeping the comments and blank lines that were above them."""
        if not self.removed or not any(id(stmt) in self.removed for stmt in block.body):
            return block
        body: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        for stmt in block.body:
            if id(stmt) in self.removed:
                carried.extend(stmt.leading_lines)
                comment = stmt.trailing_whitespace.comment
                if comment is not None:
                    carried.append(cst.EmptyLine(comment=comment))
                continue
            if carried:
                stmt = stmt.with_changes(leading_lines=[*carried, *stmt.leading_lines])
                carried = []
            body.append(stmt)
        if not body:
            # keep one statement so the block stays valid: a bare ``pass`` with the comments above it
            emptied = block.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried)])
            self.emptied[id(emptied)] = emptied
            return emptied
        changes: dict[str, Any] = {"body": body}
        if carried:
            changes[footer_field] = [*carried, *getattr(block, footer_field)]
        return block.with_changes(**changes)

    def _drop_empty_branches(self, original: cst.If, result: cst.If) -> cst.BaseStatement:
        """An ``if`` whose rewrites left a branch holding nothing but ``pass``: an empty ``else`` goes; an
        empty body with no ``else`` and a test without side effects takes the whole ``if`` with it (marked
        removed, so the enclosing block drops it in turn, keeping its comments)."""
        orelse = result.orelse
        if isinstance(orelse, cst.Else) and id(orelse.body) in self.emptied:
            result = result.with_changes(orelse=None)
        if (
            result.orelse is not None
            or id(result.body) not in self.emptied
            or id(original) in self.elifs
            or not is_pure(self.ctx, original.test)
        ):
            return result
        carried = list(result.leading_lines)
        body = result.body
        header_comment = body.header.comment if isinstance(body, cst.IndentedBlock) else body.trailing_whitespace.comment
        if header_comment is not None:
            carried.append(cst.EmptyLine(comment=header_comment))
        if isinstance(body, cst.IndentedBlock):
            carried.extend(line for stmt in body.body for line in stmt.leading_lines if line.comment is not None)
            carried.extend(line for line in body.footer if line.comment is not None)
        marker = cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried)
        self.removed[id(marker)] = marker
        return marker


# Calls that only read state; an ``if`` testing nothing else can go once its body is gone.
PURE_CALLS = frozenset(
    {
        "torch.cuda.is_available",
        "torch.cuda.device_count",
        "torch.accelerator.is_available",
        "torch.accelerator.device_count",
        "torch.distributed.is_available",
        "torch.distributed.is_initialized",
        "torch.distributed.get_backend",
        "torch.distributed.get_rank",
        "torch.distributed.get_world_size",
        "os.environ.get",
        "os.getenv",
    }
)
_PURE_BUILTINS = frozenset({"len", "isinstance", "hasattr", "bool"})
_PURE_LEAVES = (cst.Name, cst.SimpleString, cst.Integer, cst.Float, cst.Imaginary)


def is_pure(ctx: PyContext, node: cst.CSTNode) -> bool:
    """True when evaluating the expression ``node`` (an original node) changes nothing: names, attribute
    reads, literals, comparisons, ``and``/``or``/``not`` and calls of :data:`PURE_CALLS` with pure arguments."""
    if isinstance(node, _PURE_LEAVES):
        return True
    if isinstance(node, cst.Attribute):
        return is_pure(ctx, node.value)
    if isinstance(node, cst.Comparison):
        return is_pure(ctx, node.left) and all(is_pure(ctx, target.comparator) for target in node.comparisons)
    if isinstance(node, cst.BooleanOperation):
        return is_pure(ctx, node.left) and is_pure(ctx, node.right)
    if isinstance(node, cst.UnaryOperation):
        return is_pure(ctx, node.expression)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(isinstance(el, cst.Element) and is_pure(ctx, el.value) for el in node.elements)
    if isinstance(node, cst.Call):
        func = node.func
        known = ctx.qualname(func) in PURE_CALLS or (
            isinstance(func, cst.Name) and func.value in _PURE_BUILTINS and func.value not in ctx.aliases
        )
        return known and all(not arg.star and is_pure(ctx, arg.value) for arg in node.args)
    return False


def _with_todos(statement: Any, todos: list[str]) -> Any:
    present = {line.comment.value for line in statement.leading_lines if line.comment is not None}
    new = [cst.EmptyLine(comment=cst.Comment(text)) for text in dict.fromkeys(todos) if text not in present]
    if not new:
        return statement
    return statement.with_changes(leading_lines=[*statement.leading_lines, *new])


def _is_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body
    )


def _imports_only(stmt: cst.CSTNode) -> bool:
    """A ``try:``/``if`` block that only imports (``try: import x / except ImportError: x = None``)."""
    if isinstance(stmt, cst.Try):
        return isinstance(stmt.body, cst.IndentedBlock) and all(_is_import_line(s) for s in stmt.body.body)
    if isinstance(stmt, cst.If):
        return isinstance(stmt.body, cst.IndentedBlock) and all(_is_import_line(s) for s in stmt.body.body)
    return False


def _binds_torch(stmt: cst.CSTNode, torch_name: str) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                name = alias.evaluated_name
                bound = alias.evaluated_alias
                if (bound is None and name.split(".")[0] == torch_name == "torch") or (
                    bound == torch_name and name == "torch"
                ):
                    return True
    return False


def _insertion_index(ctx: PyContext, body: list[cst.BaseStatement]) -> int:
    """After the file's leading imports, and before the first top-level statement that uses the resolver."""
    start = 0
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr):
        if isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
            start = 1
    index = start
    for i in range(start, len(body)):
        stmt = body[i]
        if _is_import_line(stmt) or _imports_only(stmt):
            index = i + 1
        elif not isinstance(stmt, cst.SimpleStatementLine):
            break
    if ctx.device_first_top is not None:
        index = min(index, max(ctx.device_first_top, start))
    # never before ``from __future__`` imports
    for i in range(start, len(body)):
        stmt = body[i]
        if _is_import_line(stmt) and any(
            isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name) and s.module.value == "__future__"
            for s in stmt.body
        ):
            index = max(index, i + 1)
    return index


def _finish_module(ctx: PyContext, original: cst.Module, module: cst.Module) -> tuple[cst.Module, tuple[int, int]]:
    """Add ``import torch`` and the device resolver when the rewrites need them and the file lacks them.

    Returns the module and (index, count) of the statements added.
    """
    need_resolver = ctx.needs_device and ctx.target is Target.ACCELERATOR and not ctx.resolver_exists
    if not (need_resolver or ctx.needs_torch):
        return module, (0, 0)
    body = list(module.body)
    index = _insertion_index(ctx, list(original.body))
    new: list[cst.BaseStatement] = []
    if not any(_binds_torch(stmt, ctx.torch_name) for stmt in original.body[:index]):
        if ctx.torch_name == "torch":
            new.append(cst.parse_statement("import torch\n"))
        else:
            new.append(cst.parse_statement(f"import torch as {ctx.torch_name}\n"))
    if need_resolver:
        t = ctx.torch_name
        resolver = cst.parse_statement(
            f'{ctx.device_name} = {t}.accelerator.current_accelerator(check_available=True) or {t}.device("cpu")\n'
        )
        new.append(
            resolver.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(comment=cst.Comment(RESOLVER_COMMENT))])
        )
    if not new:
        return module, (0, 0)
    return module.with_changes(body=[*body[:index], *new, *body[index:]]), (index, len(new))


def _remove_unused_cuda_imports(ctx: PyContext, module: cst.Module, code: str) -> str:
    """Drop ``from torch.cuda import amp``-style aliases the rewrites left without a single use, and turn
    ``import torch.cuda`` into ``import torch`` once no ``torch.cuda`` is left."""
    unused: set[str] = set()
    for name, qualname in ctx.aliases.items():
        if qualname.startswith(_CUDA_MODULE_PREFIXES) and name != "torch":
            if len(re.findall(rf"(?<![\w.]){re.escape(name)}\b", code)) == 1:
                unused.add(name)
    plain_cuda_imports = len(re.findall(r"^import[ \t]+torch\.cuda\b", code, re.MULTILINE))
    retire_module = plain_cuda_imports > 0 and len(re.findall(r"\btorch\.cuda\b", code)) == plain_cuda_imports
    if not unused and not retire_module:
        return code
    body = []
    changed = False
    for stmt in module.body:
        if _is_import_line(stmt):
            smalls = []
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                    keep = []
                    for alias in small.names:
                        if _bound_name(alias) in unused and not (isinstance(small, cst.Import) and alias.asname is None):
                            continue
                        if retire_module and isinstance(small, cst.Import) and alias.asname is None and alias.evaluated_name.startswith(_CUDA_MODULE_PREFIXES[0]):
                            alias = alias.with_changes(name=cst.Name("torch"))
                        keep.append(alias)
                    if keep != list(small.names):
                        changed = True
                        if not keep:
                            continue
                        keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                        small = small.with_changes(names=keep)
                        if isinstance(small, cst.ImportFrom) and small.lpar is not None and len(keep) == 1:
                            small = small.with_changes(lpar=None, rpar=None)
                smalls.append(small)
            if not smalls:
                continue
            stmt = stmt.with_changes(body=smalls)
        body.append(stmt)
    return module.with_changes(body=body).code if changed else code


def _bound_name(alias: cst.ImportAlias) -> str:
    bound = alias.evaluated_alias
    return bound if bound is not None else alias.evaluated_name.split(".")[0]


# ---- statement gate ----------------------------------------------------------------------------------------
_IMPORT_RE = re.compile(r"\bimport\b")
_NEWLINE_RE = re.compile(r"\r\n|\r|\n")
_PAIRS: dict[type, tuple[type, ...]] = {
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: (ast.ClassDef,),
    cst.If: (ast.If,),
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: (ast.While,),
    cst.With: (ast.With, ast.AsyncWith),
    cst.Try: (ast.Try,),
    cst.TryStar: (ast.TryStar,),
    cst.Match: (ast.Match,),
}


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
                if alias.asname and CUDA_TOKENS.search(alias.name.encode()):
                    names.append(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if CUDA_TOKENS.search(f"{node.module}.{alias.name}".encode()):
                    names.append(alias.asname or alias.name)
    return names


@dataclass
class StatementMap:
    """What the stdlib parser tells about the libcst statements of one module."""

    inert: set[int]  # ids of statements with no trigger for any rule
    begins: list[int] | None  # first line (1-based, decorators included) of each top-level statement


def statement_map(module: cst.Module, source: str) -> StatementMap:
    """Top-level statements (and methods of top-level classes) whose text holds no trigger for any rule,
    and the first line of every top-level statement.

    The stdlib parser gives each statement's line span; the libcst statements are matched to it one to one
    (a ``SimpleStatementLine`` covers as many ast statements as it has small statements). Statements that
    import are always visited (their names resolve the rest). Any mismatch, or code the stdlib parser does
    not accept, disables the gate.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return StatementMap(set(), None)
    aliases = _cuda_aliases(tree)
    gate = CUDA_TOKENS
    if aliases:
        gate = re.compile(CUDA_TOKENS.pattern + b"|\\b(?:" + "|".join(map(re.escape, aliases)).encode() + b")\\b", re.IGNORECASE)
    starts = [0] + [m.end() for m in _NEWLINE_RE.finditer(source)]
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
            decorators = getattr(first, "decorator_list", None) or []
            begin = min([first.lineno, *(d.lineno for d in decorators)])
            if top:
                begins.append(begin)
            end = group[-1].end_lineno or first.lineno
            text = source[starts[begin - 1] : starts[end] if end < len(starts) else len(source)]
            if _IMPORT_RE.search(text):
                continue
            if not gate.search(text.encode("utf-8", "surrogatepass")):
                inert.add(id(stmt))
            elif isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
                if not walk(stmt.body.body, group[0].body, False):  # type: ignore[attr-defined]
                    return False
        return index == len(ast_body)

    if not walk(module.body, tree.body, True):
        return StatementMap(set(), None)
    return StatementMap(inert, begins)


class _PositionState(CodegenState):
    """Code generation that emits nothing and records start/end of a few wanted nodes only."""

    def __init__(self, module: cst.Module, wanted: set[int], tops: set[int]) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.wanted = wanted
        self.tops = tops
        self.line = 1
        self.column = 0
        self.offset = 0
        self.found: dict[int, tuple[int, int, int, int]] = {}
        self.spans: dict[int, tuple[int, int]] = {}
        self._starts: list[tuple[int, int]] = []
        self._top_start = 0

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.column += len(token)
            self.offset += len(token)

    def add_token(self, value: str) -> None:
        self.offset += len(value)
        if "\n" in value or "\r" in value:
            segments = re.split(r"\r\n?|\n", value)
            self.line += len(segments) - 1
            self.column = len(segments[-1])
        else:
            self.column += len(value)

    def pop_trailing_newline(self) -> None:
        pass

    def before_codegen(self, node: cst.CSTNode) -> None:
        key = id(node)
        if key in self.wanted:
            self._starts.append((self.line, self.column))
        if key in self.tops:
            self._top_start = self.offset

    def after_codegen(self, node: cst.CSTNode) -> None:
        key = id(node)
        if key in self.tops:
            self.spans[key] = (self._top_start, self.offset)
        if key in self.wanted:
            start = self._starts.pop()
            if key not in self.found:  # a syntactic position (without leading whitespace) wins
                self.found[key] = (*start, self.line, self.column)

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: Any = None, end_node: Any = None) -> Any:
        if id(node) in self.wanted:
            return _Recorder(self, id(node))
        return _NULL


_NULL = nullcontext()


class _Recorder:
    __slots__ = ("state", "key", "start")

    def __init__(self, state: _PositionState, key: int) -> None:
        self.state = state
        self.key = key

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc: object) -> None:
        self.state.found[self.key] = (*self.start, self.state.line, self.state.column)


def positions(
    module: cst.Module, nodes: list[cst.CSTNode], tops: list[cst.CSTNode] = ()  # type: ignore[assignment]
) -> tuple[dict[int, tuple[int, int, int, int]], dict[int, tuple[int, int]]]:
    """1-based line, 0-based column start and end of each node, and the source offsets each of ``tops``
    (top-level statements, with their leading lines) spans; both keyed by ``id(node)``."""
    state = _PositionState(module, {id(node) for node in nodes}, {id(node) for node in tops})
    module._codegen(state)
    return state.found, state.spans


@dataclass
class _Layout:
    """Where each top-level statement of the original module lies in its text, from line numbers alone."""

    spans: dict[int, tuple[int, int]]  # id(statement) -> (start, end) offsets, leading lines included
    first_lines: list[int]  # 1-based line of each statement's first leading line


def _layout(module: cst.Module, source: str, begins: list[int]) -> _Layout | None:
    """Top-level statements are whole lines: each starts ``len(leading_lines)`` lines above its first token
    line (which the stdlib parser gave) and ends where the next starts; the footer is whole lines at the end."""
    if not module.body or not module.has_trailing_newline or len(begins) != len(module.body):
        return None
    line_starts = [0] + [m.end() for m in _NEWLINE_RE.finditer(source)]
    first_lines = [begin - len(stmt.leading_lines) for begin, stmt in zip(begins, module.body)]
    lines = len(line_starts) - 1
    end_line = lines - len(module.footer)  # last line of the last statement
    if any(b <= a for a, b in zip(first_lines, first_lines[1:])) or first_lines[0] < 1 or end_line < first_lines[-1]:
        return None
    bounds = [line_starts[line - 1] for line in first_lines] + [line_starts[end_line]]
    spans = {id(stmt): (bounds[i], bounds[i + 1]) for i, stmt in enumerate(module.body)}
    return _Layout(spans, first_lines)


def _statement_positions(
    module: cst.Module, layout: _Layout, findings: list[PendingFinding]
) -> tuple[dict[int, tuple[int, int, int, int]], dict[int, int]]:
    """Positions of the findings, generating code only for the top-level statements that hold them; also the
    generated length of each such statement (to check the layout against)."""
    by_top: dict[int, list[int]] = {}
    for finding in findings:
        by_top.setdefault(finding.top, []).append(id(finding.node))
    found: dict[int, tuple[int, int, int, int]] = {}
    lengths: dict[int, int] = {}
    for top, wanted in by_top.items():
        if not 0 <= top < len(module.body):
            continue
        state = _PositionState(module, set(wanted), set())
        state.line = layout.first_lines[top]
        module.body[top]._codegen(state)
        found.update(state.found)
        lengths[top] = state.offset
    return found, lengths


def _same_lines(a: Sequence[cst.EmptyLine], b: Sequence[cst.EmptyLine]) -> bool:
    return len(a) == len(b) and all(x.deep_equals(y) for x, y in zip(a, b))


def _splice(
    source: str, original: cst.Module, new: cst.Module, spans: dict[int, tuple[int, int]], transformer: _Pass
) -> str:
    """The new module's code from the original text of every untouched top-level statement plus the code of
    the changed and added ones: the same text as ``new.code``, without generating what did not change."""
    index, count = transformer.inserted
    parts = [source[: spans[id(original.body[0])][0]]] if original.body else [source]
    for position, stmt in enumerate(new.body):
        if index <= position < index + count:
            parts.append(new.code_for_node(stmt))
            continue
        old = position - count if position >= index + count else position
        if old in transformer.dirty:
            parts.append(new.code_for_node(stmt))
        else:
            start, end = spans[id(original.body[old])]
            parts.append(source[start:end])
    if original.body:
        parts.append(source[spans[id(original.body[-1])][1] :])
    return "".join(parts)


@dataclass
class PyOutcome:
    """The result of migrating one Python source text."""

    code: str | None  # None when nothing changes
    findings: list[tuple[PendingFinding, tuple[int, int, int, int]]] = field(default_factory=list)


def migrate_source(source: str, options: MigrateOptions, rules: Mapping[str, Rule], dispatch: Dispatch) -> PyOutcome:
    """Run the rules over ``source``; raise :class:`ParseFailure` when it does not parse."""
    # Parsing and the pass allocate many short-lived, acyclic nodes: the cyclic collector only slows them down.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _migrate_source(source, options, rules, dispatch)
    finally:
        if collecting:
            gc.enable()


def _migrate_source(source: str, options: MigrateOptions, rules: Mapping[str, Rule], dispatch: Dispatch) -> PyOutcome:
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise ParseFailure(exc.message, exc.raw_line, exc.raw_column + 1) from exc
    ctx = PyContext.for_source(source, options, rules)
    transformer = _Pass(ctx, dispatch)
    statements = statement_map(module, source)
    transformer.inert = statements.inert
    new_module = module.visit(transformer)
    changed = bool(transformer.dirty or transformer.inserted[1] or transformer.top_removed)
    layout = _layout(module, source, statements.begins) if statements.begins is not None else None
    found: dict[int, tuple[int, int, int, int]] = {}
    code: str | None = None
    if layout is not None:
        found, lengths = _statement_positions(module, layout, ctx.findings)
        splice = (
            changed
            and not transformer.top_removed
            and _same_lines(module.header, new_module.header)
            and _same_lines(module.footer, new_module.footer)
        )
        if splice:
            for top in transformer.dirty:  # the layout must match what libcst generates for every changed one
                start, end = layout.spans[id(module.body[top])]
                length = lengths.get(top)
                if length is None:
                    length = len(module.code_for_node(module.body[top]))
                if length != end - start:
                    splice = False
                    break
        if splice:
            code = _splice(source, module, new_module, layout.spans, transformer)
    elif ctx.findings:
        found, _ = positions(module, [f.node for f in ctx.findings])
    ordered = sorted(
        ((f, found.get(id(f.node), (1, 0, 1, 0))) for f in ctx.findings), key=lambda item: (item[1][:2], item[0].code)
    )
    if not changed:
        return PyOutcome(None, ordered)
    if code is None:
        code = new_module.code
    if code != source:
        code = _remove_unused_cuda_imports(ctx, new_module, code)
    return PyOutcome(code if code != source else None, ordered)
