"""TPU204's repeated seeding: a ``torch.cuda.manual_seed(s)`` that an identical ``torch.manual_seed(s)`` already
ran before, in the same function or module, is deleted rather than renamed into a second ``torch.manual_seed(s)``
(harmless but noise: torch.manual_seed seeds the CPU and every device). Otherwise the cuda-api family's rename
makes it ``torch.manual_seed(s)``.

"Before" is what has always run first (:func:`~tpu_agent.migrate.rules._bound.earlier_in_scope`): the earlier
statements of its block and of the blocks around it, so build-nanogpt's ``torch.manual_seed(1337)`` then
``if torch.cuda.is_available(): torch.cuda.manual_seed(1337)`` loses the second call (and the ``if`` it leaves
empty) just as minGPT's ``set_seed`` loses its ``torch.cuda.manual_seed_all(seed)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.cstnodes import TreeReader, walk
from tpu_agent.migrate.rules._bound import earlier_in_scope
from tpu_agent.migrate.rules._cst import source
from tpu_agent.migrate.rules.cuda_api import FAMILY

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

# CUDA seeding that torch.manual_seed(s) also does (it seeds the CPU and every device)
_CUDA_SEEDS = frozenset({"torch.cuda.manual_seed", "torch.cuda.manual_seed_all"})


def _seeded_earlier(ctx: PyContext, call: cst.Call) -> bool:
    """Whether a statement that has always run before this one, in its function (or module), seeds every device
    with the same arguments, holding the same values: ``torch.manual_seed(s)`` or a CUDA seeding call that becomes
    one (seed_everything's ``torch.manual_seed(s)`` then ``torch.cuda.manual_seed(s)``; build-nanogpt's
    ``torch.manual_seed(1337)`` then ``if torch.cuda.is_available(): torch.cuda.manual_seed(1337)``). A statement
    in between that rebinds a name the arguments read ends the search: the seed may differ."""
    arguments = [source(arg.value) for arg in call.args]
    names = {node.value for arg in call.args for node in _names(arg.value)}
    for statement in earlier_in_scope(ctx):
        smalls = reversed(statement.body) if isinstance(statement, cst.SimpleStatementLine) else ()
        for small in smalls:
            if (
                isinstance(small, cst.Expr)
                and isinstance(small.value, cst.Call)
                and ctx.qualname(small.value) in (*_CUDA_SEEDS, "torch.manual_seed")
                and [source(arg.value) for arg in small.value.args] == arguments
            ):
                return True
        if names & _bound_names(statement):
            return False
    return False


def _names(node: cst.CSTNode) -> Iterator[cst.Name]:
    """Every ``Name`` in ``node``."""
    return (current for current in walk(node) if type(current) is cst.Name)


class _BoundNames(TreeReader):
    """The names a statement (re)binds, with the bases of the attributes and items it assigns: ``seed``,
    ``args`` for ``args.seed = ...``."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def _bind(self, target: cst.CSTNode | None) -> None:
        if target is not None:
            self.names.update(name.value for name in _names(target))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(node.name)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.names.add(node.name.value)
        return False  # what its body binds is its own

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def _bound_names(statement: cst.CSTNode) -> set[str]:
    visitor = _BoundNames()
    statement.visit(visitor)
    return visitor.names


@FAMILY.visit(cst.Expr)
def _repeated_seed(ctx: PyContext, node: cst.Expr) -> None:
    call = node.value
    if isinstance(call, cst.Call) and ctx.qualname(call) in _CUDA_SEEDS and _seeded_earlier(ctx, call):
        ctx.claim(call.func)  # deleted below instead of renamed into a repeat of the seeding above


@FAMILY.leave(cst.Expr)
def delete_repeated_seed(ctx: PyContext, original: cst.Expr, updated: cst.Expr) -> cst.Expr | cst.RemovalSentinel:
    call = original.value
    if not (isinstance(call, cst.Call) and ctx.is_claimed(call.func) and ctx.qualname(call) in _CUDA_SEEDS):
        return updated
    message = f"deleted `{source(original)}`: the same torch.manual_seed above already seeds every device"
    if ctx.report("TPU204", original, message):
        return cst.RemovalSentinel.REMOVE
    return updated
