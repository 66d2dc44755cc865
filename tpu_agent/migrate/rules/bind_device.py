"""TPU201's device binding: ``torch.cuda.set_device(i)`` and ``torch.accelerator.set_device_index(i)`` per rank.

On CUDA each rank binds its own GPU; TorchTPU binds one device per process (the launcher picks the chip) and
refuses any other index ("Cannot set TPU device to index 1, current process is bound to device index 0"). So
for the accelerator target the call still runs on CUDA but not on TPU (``if ... DEVICE.type != "tpu":``,
merged into an enclosing ``if`` that holds nothing else), and for the tpu target it is deleted. Code already
written against torch.accelerator (pytorch/examples' DDP, ImageNet and minGPT-ddp scripts) gets the same
treatment through the same path when its index may be another than 0 (rank, local_rank, args.gpu); the
prefilter reads such files although they name nothing CUDA. A bind function held under another name
(``set_dev = torch.cuda.set_device`` or ``self.bind = set_device``, every binding of the name being that
function: :func:`~tpu_agent.migrate.rules._bound.alias_of`) is called as the function is: TPU201's rename of the
reference keeps ``set_dev(rank)`` binding rank 1 on TPU. The index a rewritten device argument lost is passed
back where the call takes an index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import Target
from tpu_agent.migrate.rules._bound import alias_of
from tpu_agent.migrate.rules._cst import arg_position, keyword, positional, replace_arg_value, source, string_value
from tpu_agent.migrate.rules.accelerator_guards import device_function, guarded_statement, off_tpu, sole_call
from tpu_agent.migrate.rules.cuda_api import FAMILY
from tpu_agent.migrate.rules.devices import known_cuda_index

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

ONE_DEVICE = "# TorchTPU binds one device per process"


# Calls that bind the process to a device index. torch.cuda.set_device is renamed to set_device_index (TPU201's
# rename reports it); code already written against torch.accelerator calls set_device_index itself (set_device_idx
# before torch 2.7), and a file with no CUDA text is still read for it (the prefilter knows the names).
_ACCELERATOR_BINDS = frozenset({"torch.accelerator.set_device_index", "torch.accelerator.set_device_idx"})
_BIND_CALLS = _ACCELERATOR_BINDS | {"torch.cuda.set_device"}


def _called(ctx: PyContext, call: cst.Call) -> tuple[str | None, bool]:
    """(the qualified name of the function ``call`` calls, whether it is called through an alias): by its
    own name, or through a name or attribute only ever bound to it (``set_dev = torch.cuda.set_device`` then
    ``set_dev(rank)``, which TPU201's rename of the reference leaves binding rank 1 on TPU as well)."""
    qualname = ctx.qualname(call)
    if qualname is not None or not ctx.mentions("set_device"):
        return qualname, False
    alias = alias_of(ctx, call.func)
    return alias, alias is not None


def _checked(ctx: PyContext, call: cst.Call) -> bool:
    """A bind call that nothing renames and reports (torch.accelerator's own, or any through an alias): it is
    kept off TPU when its index may be another than 0."""
    qualname, through_alias = _called(ctx, call)
    return (qualname in _ACCELERATOR_BINDS or (through_alias and qualname in _BIND_CALLS)) and _binds_another_index(
        ctx, call
    )


def _binds_another_index(ctx: PyContext, call: cst.Call) -> bool:
    """Whether a torch.accelerator bind call may name an index other than the one TorchTPU bound (anything but the
    literal 0: rank, local_rank, args.gpu) and nothing around it already keeps it off TPU."""
    index = positional(call, 0) or keyword(call, "device")
    if index is None or (isinstance(index.value, cst.Integer) and index.value.evaluated_value == 0):
        return False
    return not kept_off_tpu(ctx)


def kept_off_tpu(ctx: PyContext) -> bool:
    """Whether an enclosing ``if`` (not its ``else``) already keeps the statement being rewritten off TPU, so a
    second pass of the rewrite adds no second guard."""
    return any(
        isinstance(statement, cst.If) and id(statement) not in ctx.in_orelse and tests_off_tpu(statement.test)
        for statement in ctx.stmt_stack
    )


def tests_off_tpu(test: cst.BaseExpression) -> bool:
    """``... != "tpu"`` in the test or one of its ``and`` operands: the guard this family writes."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return tests_off_tpu(test.left) or tests_off_tpu(test.right)
    return isinstance(test, cst.Comparison) and any(
        isinstance(target.operator, cst.NotEqual) and string_value(target.comparator) == "tpu"
        for target in test.comparisons
    )


def _report_bind(ctx: PyContext, statement: cst.Expr) -> bool:
    """Report a torch.accelerator bind call guarded off TPU (TPU201); True when the guard is to be written."""
    message = f"`{source(statement)}` runs off TPU only: TorchTPU binds one device per process"
    return ctx.report("TPU201", statement, message)


@FAMILY.leave(cst.SimpleStatementLine)
def bind_statement(
    ctx: PyContext, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
) -> cst.BaseStatement:
    calls = sole_call(ctx, original, updated)
    if calls is None:
        return updated
    before, after = calls
    renamed = ctx.qualname(before) == "torch.cuda.set_device" and device_function(ctx, after.func) == "set_device_index"
    if renamed or (_checked(ctx, before) and _report_bind(ctx, cst.ensure_type(original.body[0], cst.Expr))):
        return keep_off_tpu(ctx, original, updated)
    return updated


def keep_off_tpu(
    ctx: PyContext, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
) -> cst.BaseStatement:
    """``set_device_index(i)`` binds rank i's GPU on CUDA, but TorchTPU binds one device per process and
    rejects any other index (and a per-process device count checked against the world size, TPU216, fails on
    it): run the statement only off TPU, merging into an enclosing ``if`` that holds nothing else
    rather than nesting."""
    parent = ctx.stmt_stack[-2] if len(ctx.stmt_stack) > 1 else None
    if _sole_statement(parent, original):
        _merge_into(ctx, parent)  # type: ignore[arg-type]
        return updated
    return guarded_statement(off_tpu(ctx), updated, ONE_DEVICE)


def _sole_statement(parent: cst.CSTNode | None, node: cst.CSTNode) -> bool:
    """True when ``node`` is all there is in the body of the ``if`` ``parent``, which has no ``else``."""
    if not isinstance(parent, cst.If) or parent.orelse is not None:
        return False
    body = parent.body.body
    return len(body) == 1 and body[0] is node


def _merge_into(ctx: PyContext, statement: cst.If) -> None:
    ctx.extra_tests[id(statement)] = (off_tpu(ctx), ONE_DEVICE)


@FAMILY.visit(cst.Expr)
def _set_device_statement(ctx: PyContext, node: cst.Expr) -> None:
    call = node.value
    if not isinstance(call, cst.Call):
        return
    renamed = ctx.qualname(call) == "torch.cuda.set_device"
    if renamed:
        enabled = ctx.options.rule_enabled("TPU201")
    elif _checked(ctx, call):
        enabled = True
    else:
        return
    sole = bool(ctx.stmt_stack) and _sole_statement(ctx.stmt_stack[-1], node)  # `if c: torch.cuda.set_device(i)`
    if ctx.target is Target.TPU:
        ctx.claim(call.func)  # deleted below instead of renamed
    elif enabled and sole and (renamed or _report_bind(ctx, node)):
        _merge_into(ctx, ctx.stmt_stack[-1])  # type: ignore[arg-type]


@FAMILY.leave(cst.Expr)
def delete_set_device(ctx: PyContext, original: cst.Expr, updated: cst.Expr) -> cst.Expr | cst.RemovalSentinel:
    call = original.value
    if not (isinstance(call, cst.Call) and ctx.is_claimed(call.func) and _called(ctx, call)[0] in _BIND_CALLS):
        return updated
    if ctx.report("TPU201", original, f"deleted `{source(original)}`: TorchTPU binds one device per process"):
        return cst.RemovalSentinel.REMOVE
    return updated


# torch.cuda calls whose torch.accelerator twin takes a device *index*: the device a rule rewrote their argument
# to (DEVICE, torch.device("tpu")) has no index, so set_device_index(DEVICE) raises on CUDA and
# device_index(<a device>) raises everywhere; they get the index the CUDA device named instead.
_INDEX_PARAMETER = frozenset({"torch.cuda.set_device", "torch.cuda.device"})


@FAMILY.leave(cst.Call)
def pass_device_index(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    qualname, through_alias = _called(ctx, original)
    if qualname not in _INDEX_PARAMETER or not (through_alias or device_function(ctx, updated.func)):
        return updated
    before, after = positional(original, 0), positional(updated, 0)
    if before is None or after is None:
        return updated
    index = known_cuda_index(ctx, before.value)
    if index is None:
        return updated
    return replace_arg_value(updated, arg_position(updated, after), index)
