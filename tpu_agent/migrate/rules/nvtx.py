"""TPU215: ``torch.cuda.nvtx.range_push(name)`` ... ``range_pop()`` pairs in one block become a
``with torch.profiler.record_function(name):`` block around the statements between them.

A pair is matched within one indented block (a function body, a loop body), pushes and pops nesting like
brackets; the statements between them move into the ``with`` body. A push or pop without its partner in the
same block, one whose statement carries comments (they would have no place to go), and ``nvtx.mark`` stay
reports (TPU207). ``record_function`` ranges appear in every torch profiler trace, XProf's on TPU included,
and unlike a push/pop pair they close when the code between them raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules.cuda_api import FAMILY
from tpu_agent.migrate.rules.references import PROFILER

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY.rule(
    code="TPU215",
    name="cuda-nvtx-push-pop-pair",
    safety=Safety.SAFE,
    summary="torch.cuda.nvtx.range_push / range_pop pairs in one block.",
    rationale="NVTX ranges exist only in NVIDIA tools; a torch.profiler.record_function range around the same "
    "statements appears in every torch profiler trace (XProf on TPU). The with block also closes the range when "
    "the code inside raises, where an unbalanced push would leave it open.",
    before='torch.cuda.nvtx.range_push("forward")\nloss = model(batch)\ntorch.cuda.nvtx.range_pop()',
    after='with torch.profiler.record_function("forward"):\n    loss = model(batch)',
    references=(f"{PROFILER}#torch.profiler.record_function",),
    apis=(
        ApiEquivalent(
            "torch.cuda.nvtx.range_push(name) ... torch.cuda.nvtx.range_pop()",
            "with torch.profiler.record_function(name): ...",
        ),
    ),
)

_PUSH = "torch.cuda.nvtx.range_push"
_POP = "torch.cuda.nvtx.range_pop"


def _call_of(ctx: PyContext, stmt: cst.CSTNode) -> tuple[str, cst.Call] | None:
    """(push/pop, the call) for a comment-free statement line holding only that call."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
        return None
    name = ctx.qualname(small.value.func)
    if name not in (_PUSH, _POP):
        return None
    if stmt.trailing_whitespace.comment is not None or any(line.comment for line in stmt.leading_lines):
        return None
    return name, small.value


def _pairs(ctx: PyContext, body: Sequence[cst.CSTNode]) -> list[tuple[int, int]]:
    """(push index, pop index) of the balanced pairs among ``body``'s statements, outermost first."""
    pairs: list[tuple[int, int]] = []
    open_pushes: list[int] = []
    for index, stmt in enumerate(body):
        found = _call_of(ctx, stmt)
        if found is None:
            continue
        name, call = found
        if name == _PUSH and len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star:
            open_pushes.append(index)
        elif name == _POP and not call.args and open_pushes:
            pairs.append((open_pushes.pop(), index))
    return sorted(pairs)


@FAMILY.visit(cst.IndentedBlock)
def _claim_pairs(ctx: PyContext, node: cst.IndentedBlock) -> None:
    if not ctx.mentions("range_push"):
        return
    for push, pop in _pairs(ctx, node.body):
        for index in (push, pop):
            ctx.claim(node.body[index].body[0].value.func)  # type: ignore[attr-defined]  # _call_of checked it


@FAMILY.leave(cst.IndentedBlock)
def nvtx_pairs(ctx: PyContext, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
    if not ctx.mentions("range_push"):
        return updated
    pairs = _pairs(ctx, original.body)
    if not pairs:
        return updated
    applied = [pair for pair in pairs if _report(ctx, original, updated, pair)]
    if not applied:
        return updated
    return updated.with_changes(body=_wrapped(ctx, list(updated.body), applied, 0, len(updated.body)))


def _report(ctx: PyContext, original: cst.IndentedBlock, updated: cst.IndentedBlock, pair: tuple[int, int]) -> bool:
    """Report the pair; True when it is rewritten. A range another rule emptied a statement in stays a report
    (the emptied statement is dropped by the pass from the block it was in, not from a new one)."""
    push, pop = pair
    call = original.body[push].body[0].value  # type: ignore[attr-defined]  # _pairs holds checked lines only
    name = cst.Module(body=[]).code_for_node(call.args[0].value)
    emptied = any(_is_pass(updated.body[i]) and not _is_pass(original.body[i]) for i in range(push + 1, pop))
    if not emptied and ctx.report(
        "TPU215", call, f"nvtx range_push({name}) ... range_pop() -> with torch.profiler.record_function({name}):"
    ):
        return True
    ctx.report("TPU207", call, f"{_PUSH}({name}): wrap the range in `with torch.profiler.record_function({name}):`")
    return False


def _is_pass(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Pass)


def _wrapped(
    ctx: PyContext, body: list[cst.BaseStatement], pairs: list[tuple[int, int]], start: int, end: int
) -> list[cst.BaseStatement]:
    """``body[start:end]`` with each outermost pair inside it turned into a ``with`` block (inner pairs too)."""
    out: list[cst.BaseStatement] = []
    index = start
    for push, pop in pairs:
        if push < index or pop >= end:
            continue  # nested in a pair already wrapped, or outside this slice
        out.extend(body[index:push])
        inner = _wrapped(ctx, body, pairs, push + 1, pop) or [cst.SimpleStatementLine(body=[cst.Pass()])]
        line = body[push]
        assert isinstance(line, cst.SimpleStatementLine)  # a checked push line: the pass leaves it as it is
        push_call = line.body[0].value  # type: ignore[attr-defined]  # an Expr holding the call, as checked
        record = cst.Call(func=ctx.torch_attr("profiler.record_function"), args=[push_call.args[0]])
        out.append(
            cst.With(
                items=[cst.WithItem(item=record)],
                body=cst.IndentedBlock(body=inner),
                leading_lines=line.leading_lines,
            )
        )
        index = pop + 1
    out.extend(body[index:end])
    return out
