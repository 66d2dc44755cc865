"""TPU2xx, the cuda-api family's second half: what the rewritten ``torch.accelerator`` calls need to keep running.

torch.accelerator calls raise where no accelerator exists, take the device positionally only, and TorchTPU's device
properties have three fields: the handlers here guard statements and give expressions their CPU value (accelerator
target), move a ``device=`` keyword to its position, and report the CUDA-only property fields. They need none of
the tables of :mod:`~tpu_agent.migrate.rules.cuda_api`, whose family they register with; other families use the
guard builders (:func:`off_tpu`, :func:`guarded_statement`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.rules._bound import always_bound_to_call, bound_earlier
from tpu_agent.migrate.rules._cst import keyword, source, string_value
from tpu_agent.migrate.rules.cuda_api import FAMILY

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext


# ---- CPU fallback for the accelerator target --------------------------------------------------------------
# torch.accelerator calls raise where no accelerator exists; the accelerator target keeps such programs
# running on CPU-only machines by guarding them (statements) or giving them their CPU value (expressions).
# set_device_index is bind_device's: it is kept off TPU as well.
_GUARDED_STATEMENTS = frozenset(
    {
        "synchronize",
        "empty_cache",
        "reset_peak_memory_stats",
        "reset_accumulated_memory_stats",
        "set_stream",
    }
)
_CPU_VALUES = {
    "memory_allocated": "0",
    "max_memory_allocated": "0",
    "memory_reserved": "0",
    "max_memory_reserved": "0",
    "current_device_index": "0",
    "memory_stats": "{}",
    "get_memory_info": "(0, 0)",
}
_CPU_NAME = "cpu"  # what get_device_name() reads without an accelerator (get_device_properties has no CPU value)
_AVAILABLE = frozenset({"torch.cuda.is_available", "torch.accelerator.is_available"})


def device_function(ctx: PyContext, node: cst.BaseExpression) -> str | None:
    """``X`` when ``node`` is the rewritten ``torch.accelerator.X`` or ``torch.get_device_module(DEVICE).X``
    (spelled with the file's torch alias)."""
    if not isinstance(node, cst.Attribute):
        return None
    owner = node.value
    if isinstance(owner, cst.Call) and len(owner.args) == 1:
        owner = owner.func
        expected = "get_device_module"
    else:
        expected = "accelerator"
    if (
        isinstance(owner, cst.Attribute)
        and owner.attr.value == expected
        and isinstance(owner.value, cst.Name)
        and owner.value.value == ctx.torch_name
    ):
        return node.attr.value
    return None


def is_availability_test(ctx: PyContext, node: cst.BaseExpression) -> bool:
    """True when ``node`` (an original node) is only true with an accelerator present: the check itself, a
    name assigned from it, a test that a device is CUDA, or an ``and`` with one of those."""
    if isinstance(node, cst.Call):
        return not node.args and ctx.qualname(node) in _AVAILABLE
    if isinstance(node, cst.Name):
        return node.value in ctx.available_names
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
        return is_availability_test(ctx, node.left) or is_availability_test(ctx, node.right)
    return _is_cuda_test(node)


def _is_cuda_test(node: cst.BaseExpression) -> bool:
    """``device.type == "cuda"``, ``"cuda" in args.device``, ``x.is_cuda`` (timm's ``if device.type == 'cuda':
    torch.cuda.synchronize()``): true only on CUDA as written, and only on the accelerator in use once TPU104
    ports it, so what it guards needs no availability guard of its own."""
    if isinstance(node, cst.Attribute):
        return node.attr.value == "is_cuda"
    if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1:
        return False
    test = node.comparisons[0]
    if isinstance(test.operator, cst.Equal):
        return "cuda" in (string_value(node.left), string_value(test.comparator))
    return isinstance(test.operator, cst.In) and string_value(node.left) == "cuda"


@FAMILY.visit(cst.Assign)
def _availability_name(ctx: PyContext, node: cst.Assign) -> None:
    # use_cuda = torch.cuda.is_available(): `if use_cuda:` guards what it holds
    if (
        len(node.targets) == 1
        and isinstance(node.targets[0].target, cst.Name)
        and is_availability_test(ctx, node.value)
    ):
        ctx.available_names.add(node.targets[0].target.value)


def already_guarded(ctx: PyContext) -> bool:
    """Whether the statement being rewritten sits in the body of an ``if`` on accelerator availability."""
    return any(
        isinstance(statement, cst.If)
        and id(statement) not in ctx.in_orelse
        and is_availability_test(ctx, statement.test)
        for statement in ctx.stmt_stack
    )


def _owner_of_orelse(ctx: PyContext, node: cst.CSTNode) -> int | None:
    """The id of the ``if`` whose ``else`` or ``elif`` ``node`` is (an ``elif`` is on the statement stack by now)."""
    stack = ctx.stmt_stack if isinstance(node, cst.Else) else ctx.stmt_stack[:-1]
    owner = stack[-1] if stack else None
    return id(owner) if isinstance(owner, cst.If) and owner.orelse is node else None


@FAMILY.visit(cst.Else)
@FAMILY.visit(cst.If)
def _enter_orelse(ctx: PyContext, node: cst.Else | cst.If) -> None:
    owner = _owner_of_orelse(ctx, node)
    if owner is not None:
        ctx.in_orelse.add(owner)


@FAMILY.leave(cst.Else)
def _leave_else(ctx: PyContext, original: cst.Else, updated: cst.Else) -> cst.Else:
    owner = _owner_of_orelse(ctx, original)
    if owner is not None:
        ctx.in_orelse.discard(owner)
    return updated


def availability_call(ctx: PyContext) -> cst.Call:
    """``torch.accelerator.is_available()``: the test of every CPU guard the accelerator target writes."""
    return cst.Call(func=ctx.torch_attr("accelerator.is_available"))


def guarded_statement(
    test: cst.BaseExpression, statement: cst.SimpleStatementLine, comment: str | None = None
) -> cst.If:
    """``if test:`` around ``statement``, which hands its leading lines to the ``if``."""
    return cst.If(
        test=test,
        body=cst.IndentedBlock(body=[statement.with_changes(leading_lines=[])], header=_header(comment)),
        leading_lines=statement.leading_lines,
    )


def _header(comment: str | None) -> cst.TrailingWhitespace:
    if comment is None:
        return cst.TrailingWhitespace()
    return cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment))


def sole_call(
    ctx: PyContext, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
) -> tuple[cst.Call, cst.Call] | None:
    """The call a statement line is made of, before and after this pass's rewrites, when the line is that one
    call alone and the target is the accelerator (only there does a statement get a device guard)."""
    if ctx.target.value != "accelerator" or len(updated.body) != 1 or len(original.body) != 1:
        return None
    small, before = updated.body[0], original.body[0]
    if not (
        isinstance(small, cst.Expr)
        and isinstance(small.value, cst.Call)
        and isinstance(before, cst.Expr)
        and isinstance(before.value, cst.Call)
    ):
        return None
    return before.value, small.value


@FAMILY.leave(cst.SimpleStatementLine)
def guard_statement(
    ctx: PyContext, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
) -> cst.BaseStatement:
    calls = sole_call(ctx, original, updated)
    if calls is None:
        return updated
    qualname = ctx.qualname(calls[0])
    if qualname is None or not qualname.startswith("torch.cuda."):
        return updated
    function = device_function(ctx, calls[1].func)
    if function not in _GUARDED_STATEMENTS or already_guarded(ctx):
        return updated
    return guarded_statement(availability_call(ctx), updated)


def not_tpu(ctx: PyContext) -> cst.Comparison:
    """``DEVICE.type != "tpu"``: the device in use is not a TPU."""
    return cst.Comparison(
        left=ctx.device_type(),
        comparisons=[cst.ComparisonTarget(operator=cst.NotEqual(), comparator=cst.SimpleString('"tpu"'))],
    )


def off_tpu(ctx: PyContext) -> cst.BaseExpression:
    """``DEVICE.type != "tpu"``, behind ``torch.accelerator.is_available() and`` unless already checked."""
    if already_guarded(ctx):
        return not_tpu(ctx)
    return cst.BooleanOperation(left=availability_call(ctx), operator=cst.And(), right=not_tpu(ctx))


_LOOSE_TESTS = (cst.IfExp, cst.Lambda, cst.NamedExpr)


@FAMILY.leave(cst.If)
def merge_test(ctx: PyContext, original: cst.If, updated: cst.If) -> cst.If:
    owner = _owner_of_orelse(ctx, original)  # an elif: its ``if`` guards again past it
    if owner is not None:
        ctx.in_orelse.discard(owner)
    extra = ctx.extra_tests.pop(id(original), None)
    if extra is None:
        return updated
    condition, comment = extra
    test = updated.test
    loose = isinstance(test, _LOOSE_TESTS) or (
        isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or)
    )
    if loose and not test.lpar:
        test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    body = updated.body
    if isinstance(body, cst.IndentedBlock) and body.header.comment is None:
        body = body.with_changes(header=_header(comment))
    elif isinstance(body, cst.SimpleStatementSuite) and body.trailing_whitespace.comment is None:
        body = body.with_changes(trailing_whitespace=_header(comment))
    return updated.with_changes(test=cst.BooleanOperation(left=test, operator=cst.And(), right=condition), body=body)


# the fields of TorchTPU's device properties (_TpuDeviceProperties); CUDA's others (major, minor, L2_cache_size...)
# do not exist on TPU
_TPU_PROPERTIES = frozenset({"name", "total_memory", "multi_processor_count"})


_DEVICE_PROPERTIES = "torch.cuda.get_device_properties"


@FAMILY.leave(cst.Attribute)
def cuda_only_property(ctx: PyContext, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
    """``torch.cuda.get_device_properties(d).major``, directly, through a name bound just before, or through a
    name or attribute the module only ever binds to device properties (a module global, ``self.props`` set in
    ``__init__``, a class attribute): the call is rewritten (TPU201), the field it reads raises AttributeError
    on TPU, so it is reported as a capability check."""
    field_name = original.attr.value
    if field_name in _TPU_PROPERTIES or field_name.startswith("__") or not ctx.mentions("get_device_properties"):
        return updated
    value = original.value
    if isinstance(value, cst.Name):
        value = bound_earlier(ctx, value.value) or value
    if (isinstance(value, cst.Call) and ctx.qualname(value) == _DEVICE_PROPERTIES) or always_bound_to_call(
        ctx, value, _DEVICE_PROPERTIES
    ):
        ctx.report(
            "TPU208",
            original,
            f"{source(original)}: TPU device properties have only name, total_memory and multi_processor_count; "
            f"gate on an explicit option instead of {field_name}",
            fixable=False,
        )
    return updated


@FAMILY.leave(cst.Call)
def positional_device(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    """torch.accelerator's functions take the device positionally only (``synchronize(device=None, /)``) where
    torch.cuda's also take ``device=``: timm's loader's ``torch.cuda.current_stream(device=self.device)``,
    renamed as it stood, raised TypeError. The keyword goes; a positional device means the same to both."""
    qualname = ctx.qualname(original)
    if type(updated) is not cst.Call or qualname is None or not qualname.startswith("torch.cuda."):
        return updated
    device = keyword(updated, "device")
    if device is None or len(updated.args) != 1 or device_function(ctx, updated.func) is None:
        return updated
    return updated.with_changes(args=[device.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)])


@FAMILY.leave(cst.Call)
def cpu_value(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if ctx.target.value != "accelerator" or _is_expression_statement(ctx.stmt_stack[-1], original):
        return updated  # a bare call statement is guarded as a statement
    qualname = ctx.qualname(original)
    if qualname is None or not qualname.startswith("torch.cuda."):
        return updated
    function = device_function(ctx, updated.func)
    if function == "get_device_name":
        default: cst.BaseExpression = ctx.string(_CPU_NAME)
    elif function in _CPU_VALUES:
        default = cst.parse_expression(_CPU_VALUES[function])
    else:
        return updated
    if already_guarded(ctx):
        return updated
    guarded: cst.BaseExpression = cst.IfExp(test=availability_call(ctx), body=updated, orelse=default)
    if not ctx.is_bare(original):
        guarded = guarded.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    ctx.cpu_fallbacks[id(guarded)] = guarded
    return guarded


@FAMILY.leave(cst.IfExp)
def drop_inner_fallbacks(ctx: PyContext, original: cst.IfExp, updated: cst.IfExp) -> cst.IfExp:
    """``torch.cuda.get_device_name() if use_cuda else "cpu"`` needs no CPU value of its own."""
    if not ctx.cpu_fallbacks or not is_availability_test(ctx, original.test):
        return updated
    return updated.with_changes(body=updated.body.visit(_DropFallbacks(ctx)))


class _DropFallbacks(cst.CSTTransformer):
    def __init__(self, ctx: PyContext) -> None:
        super().__init__()
        self.ctx = ctx

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        test = updated_node.test
        if (
            id(original_node) in self.ctx.cpu_fallbacks
            and isinstance(test, cst.Call)
            and device_function(self.ctx, test.func) == "is_available"
        ):
            return updated_node.body
        return updated_node


def _is_expression_statement(line: cst.CSTNode, call: cst.Call) -> bool:
    return isinstance(line, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Expr) and small.value is call for small in line.body
    )
