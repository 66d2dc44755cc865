"""The rule pass: one libcst transformer per file that dispatches every node to the rule handlers.

Speed matters (thousands of lines per second per core), so the pass avoids libcst's metadata providers:
qualified names come from the file's own imports (:class:`~tpu_agent.migrate.engine.context.PyContext`)
and the structure the rules rely on (call functions, assignment targets, bare boolean positions) is
recorded on the way down. On the way up it removes statements a rule emptied, keeping their comments,
and records which top-level statements changed (:class:`Edits`) so the splicer regenerates only those.

Every handler call is isolated (:meth:`RulePass._run`): an exception inside one rule at one node costs that
one edit, reported at its line under the rule's code, never the rest of the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from tpu_agent.migrate.cstnodes import ATOMS
from tpu_agent.migrate.engine.context import PyContext
from tpu_agent.migrate.engine.dispatch import Dispatch
from tpu_agent.migrate.engine.imports import finish_module
from tpu_agent.migrate.rules._cst import is_pure

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


@dataclass
class Edits:
    """What the pass changed at the top level of the module (what the splicer needs)."""

    dirty: set[int] = field(default_factory=set)  # indexes of top-level statements something changed in
    # per statement of the new module body: the index of the original statement it came from, None for an
    # added one (removed statements have no entry)
    origins: list[int | None] = field(default_factory=list)
    changed_body: bool = False  # statements were added to or removed from the module body

    @property
    def changed(self) -> bool:
        return bool(self.dirty or self.changed_body)


class RulePass(cst.CSTTransformer):
    """The single transformer of a file: records structure on the way down, runs the handlers, and tidies
    what the rewrites left (emptied statements, empty branches, TODO comments) on the way up."""

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
        self.edits = Edits()
        # the pass does not descend into atoms (:data:`~tpu_agent.migrate.cstnodes.ATOMS`), and passes these by on the
        # way up: no leave handler looks at them (names are not among them: the reference handlers see those)
        self.passive = frozenset(kind for kind in ATOMS if kind not in dispatch.leave and kind is not cst.Name)

    # libcst calls these for every field of every node to look up visit_<Node>_<field> methods; none exist.
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    # Structure the rules rely on, recorded on the way down. ``node`` is typed Any: dispatch is on the exact
    # type (``kind is cst.Call``, cheaper than isinstance on every node of every file), which mypy cannot narrow.
    def on_visit(self, node: Any) -> bool:
        ctx = self.ctx
        kind = type(node)
        if kind in ATOMS:
            for fn in self.dispatch.visit.get(kind, ()):
                self._run(fn, node, None, node)
            return False
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
                self._run(fn, node, None, node)
            return False
        elif kind is cst.Assign:
            for target in node.targets:
                ctx.not_references.add(id(target.target))
                ctx.targets.add(id(target.target))
            ctx.bare_positions.add(id(node.value))
        elif kind is cst.AugAssign or kind is cst.AnnAssign:
            ctx.not_references.add(id(node.target))
            ctx.targets.add(id(node.target))
            if node.value is not None:
                ctx.bare_positions.add(id(node.value))
        elif kind is cst.Param:
            ctx.not_references.add(id(node.name))
        elif kind is cst.AsName:
            ctx.not_references.add(id(node.name))
        elif kind is cst.Global or kind is cst.Nonlocal:
            return False
        elif kind is cst.FormattedString:
            ctx.fstring_quotes.append(node.end)
        elif kind is cst.BooleanOperation:
            ctx.bare_positions.update((id(node.left), id(node.right)))
            ctx.operands.update((id(node.left), id(node.right)))
        elif kind is cst.UnaryOperation and isinstance(node.operator, cst.Not):
            ctx.bare_positions.add(id(node.expression))
            ctx.operands.add(id(node.expression))
        elif kind is cst.Return or kind is cst.Assert:
            inner = node.value if kind is cst.Return else node.test
            if inner is not None:
                ctx.bare_positions.add(id(inner))
        for fn in self.dispatch.visit.get(kind, ()):
            self._run(fn, node, None, node)
        return True

    def on_leave(self, original: Any, updated: Any) -> Any:
        kind = type(original)
        if kind in self.passive:
            return updated
        ctx = self.ctx
        result = updated
        for fn in self.dispatch.leave.get(kind, ()):
            result = self._run(fn, original, result, original, result)
            if type(result) is not kind:
                break
        if (
            (kind is cst.Name or kind is cst.Attribute)
            and result is updated
            and id(original) not in ctx.not_references
            and id(original) not in ctx.claimed
        ):
            qualname = ctx.qualname(original)
            if qualname is not None:
                handler = self.dispatch.reference_handler(qualname)
                if handler is not None:
                    result = self._run(handler, original, result, original, result, qualname)
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
            finished, (index, count) = finish_module(ctx, original, result)
            origins: list[int | None] = list(range(len(original.body)))
            origins[index:index] = [None] * count
            result = self._strip_removed(finished, "footer", origins)
            self.edits.origins = origins
            self.edits.changed_body = len(result.body) != len(original.body) or count > 0
            return result
        if result is not updated:
            self.edits.dirty.add(ctx.top_index)
        return result

    def _run(self, fn: Callable[..., Any], original: cst.CSTNode, unchanged: Any, *args: Any) -> Any:
        """``fn(ctx, *args)``, one rule handler at one node. An exception inside it drops this one edit: what
        the handler reported or asked for (an import, the resolver) is rolled back, an internal finding at the
        node names the rule and asks for a report, ``unchanged`` is returned and the pass goes on, so the rest
        of the file is still migrated. Running out of stack or memory is the file's, not the rule's: re-raised."""
        ctx = self.ctx
        mark = ctx.mark()
        try:
            return fn(ctx, *args)
        except (RecursionError, MemoryError):
            raise
        except Exception as exc:  # a bug in one rule must cost one edit, never the file
            ctx.internal_error(mark, self.dispatch.owners.get(fn, ""), original, exc)
            return unchanged

    def _strip_removed(self, block: Any, footer_field: str, origins: list[int | None] | None = None) -> Any:
        """Drop statements a rule emptied, keeping the comments and blank lines that were above them.

        ``origins`` (the module body's, see :class:`Edits`) loses the removed statements' entries, and a
        statement that takes over their comments counts as changed."""
        if not self.removed or not any(id(stmt) in self.removed for stmt in block.body):
            return block
        body: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        kept: list[int | None] = []
        for position, stmt in enumerate(block.body):
            if id(stmt) in self.removed:
                carried.extend(stmt.leading_lines)
                comment = stmt.trailing_whitespace.comment
                if comment is not None:
                    carried.append(cst.EmptyLine(comment=comment))
                continue
            if origins is not None:
                kept.append(origins[position])
            if carried:
                stmt = stmt.with_changes(leading_lines=[*carried, *stmt.leading_lines])
                carried = []
                origin = origins[position] if origins is not None else None
                if origin is not None:
                    self.edits.dirty.add(origin)
            body.append(stmt)
        if origins is not None:
            origins[:] = kept if body else [None]
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
        if isinstance(body, cst.IndentedBlock):
            header_comment = body.header.comment
        else:
            assert isinstance(body, cst.SimpleStatementSuite)  # the only other suite libcst has
            header_comment = body.trailing_whitespace.comment
        if header_comment is not None:
            carried.append(cst.EmptyLine(comment=header_comment))
        if isinstance(body, cst.IndentedBlock):
            statements = [s for s in body.body if isinstance(s, (cst.SimpleStatementLine, cst.BaseCompoundStatement))]
            carried.extend(line for stmt in statements for line in stmt.leading_lines if line.comment is not None)
            carried.extend(line for line in body.footer if line.comment is not None)
        marker = cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried)
        self.removed[id(marker)] = marker
        return marker


def _with_todos(statement: Any, todos: list[str]) -> Any:
    present = {line.comment.value for line in statement.leading_lines if line.comment is not None}
    new = [cst.EmptyLine(comment=cst.Comment(text)) for text in dict.fromkeys(todos) if text not in present]
    if not new:
        return statement
    return statement.with_changes(leading_lines=[*statement.leading_lines, *new])
