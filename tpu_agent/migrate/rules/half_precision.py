"""TPU304: casts of a model, a batch or the default dtype to float16 (``model.half()``, ``x.to(torch.float16)``).

TorchTPU runs float16 tensors, but bfloat16 is the TPU's native type: the MXU computes in bf16, and fp16 needs
loss scaling that bf16 does not. A float16 cast therefore works on TPU yet runs a non-native dtype, so each cast
site is reported with the bf16 spelling. It is never rewritten: fp16 -> bf16 changes numerics and the dtype of
saved checkpoints, which a person decides. Only casts are looked at: ``torch.finfo(torch.float16)`` and dtype
comparisons are not casts, and CUDA's ``torch.autocast("cuda", dtype=torch.float16)`` is TPU301's rewrite; a
device-agnostic ``torch.autocast(device.type, dtype=torch.float16)`` is reported here, as it autocasts the TPU to
float16 too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.analysis.bindings import dotted as ast_dotted
from tpu_agent.migrate.cstnodes import dotted
from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules._bound import key_of
from tpu_agent.migrate.rules._cst import arg_source, keyword, positional, source, string_value
from tpu_agent.migrate.rules.amp import AUTOCASTS, FAMILY
from tpu_agent.migrate.rules.devices import cuda_device_code
from tpu_agent.migrate.rules.references import AMP

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY.rule(
    code="TPU304",
    name="float16-cast",
    safety=Safety.MANUAL,
    summary="A float16 cast: model.half(), x.to(torch.float16), .type(torch.HalfTensor), "
    "torch.set_default_dtype(torch.float16), device-agnostic torch.autocast(device.type, dtype=torch.float16).",
    rationale="TorchTPU runs float16, but bfloat16 is the TPU's native type (the MXU computes in bf16; fp16 needs "
    "loss scaling, bf16 does not), so a model or batch cast to float16 runs a non-native dtype. Reported, not "
    "rewritten: fp16 -> bf16 changes numerics and checkpoint dtypes. Casts through a name bound only to float16 "
    "(dtype = torch.float16 if args.fp16 else torch.float32) are reported where the cast is; a choice that "
    "already offers bfloat16 (torch.bfloat16 if ... else torch.float16) is left alone, as is a tensor factory's "
    "dtype (torch.zeros(..., dtype=torch.float16)): a buffer's dtype matters far less than the model's and the "
    "batch's, whose casts are reported.",
    before="model = model.half()\nx = x.to(device, torch.float16)",
    after="model = model.bfloat16()\nx = x.to(device, torch.bfloat16)  # and drop the GradScaler (TPU302)",
    references=(AMP,),
    apis=(
        ApiEquivalent("model.half()", "model.bfloat16()"),
        ApiEquivalent("x.to(torch.float16), x.type(torch.HalfTensor)", "x.to(torch.bfloat16)"),
    ),
)

_HALF = frozenset({"torch.float16", "torch.half", "torch.HalfTensor", "torch.cuda.HalfTensor"})
_BF16 = "torch.bfloat16"
_CASTS = frozenset({"to", "type"})
_WHY = (
    "bf16 is TPU-native (the MXU computes in bfloat16; float16 runs but is not native and needs loss scaling): "
    "switch by hand, since bf16 changes numerics and checkpoint dtypes, and drop the GradScaler (TPU302)"
)


def _cst_choices(ctx: PyContext, node: cst.BaseExpression) -> Iterator[str | None]:
    """The qualified names a dtype expression can be: each branch of a conditional expression."""
    if isinstance(node, cst.IfExp):
        yield from _cst_choices(ctx, node.body)
        yield from _cst_choices(ctx, node.orelse)
    else:
        yield ctx.qualname(node)


def _ast_choices(ctx: PyContext, node: ast.expr | None) -> Iterator[str | None]:
    """:func:`_cst_choices` of a value the module binds (the stdlib tree :mod:`bindings` reads)."""
    if isinstance(node, ast.IfExp):
        yield from _ast_choices(ctx, node.body)
        yield from _ast_choices(ctx, node.orelse)
    else:
        name = ast_dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        yield ctx.resolve(name) if name is not None else None


def _half_only(choices: list[str | None]) -> bool:
    """float16 is a choice and bfloat16 is not (code that already picks bf16 where it can is left alone)."""
    return any(choice in _HALF for choice in choices) and _BF16 not in choices


def _half_dtype(ctx: PyContext, node: cst.BaseExpression) -> str | None:
    """How ``node`` is float16: ``""`` when it says so itself, the name when it is a name (or attribute) every
    binding of which in the module is a float16 choice; None when it is not float16."""
    if _half_only(list(_cst_choices(ctx, node))):
        return ""
    key = key_of(node) if ctx.qualname(node) is None else None
    if key is None:
        return None
    values = ctx.bindings.of(key[0])
    if values and all(value is not None and _half_only(list(_ast_choices(ctx, value))) for value in values):
        return source(node)
    return None


def _report(ctx: PyContext, original: cst.Call, arg: cst.Arg, name: str) -> None:
    """One finding for the cast ``original`` whose argument ``arg`` is float16, with the bf16 spelling (of the
    argument alone: a long receiver such as ``nn.Sequential(...)`` would bury it)."""
    if name:
        advice = f"bind {name} to torch.bfloat16"
    else:
        bf16 = arg.with_changes(value=dotted(f"{ctx.torch_name}.bfloat16"))
        advice = f"pass {arg_source(bf16)} instead of {arg_source(arg)}"
    ctx.report("TPU304", original, f"{source(original)} casts to float16: {advice}; {_WHY}", fixable=False)


@FAMILY.leave(cst.Call)
def float16_cast(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    func = original.func
    # a method of a tensor or module, not of an imported name (``np.half`` is a type, not a cast)
    if isinstance(func, cst.Attribute) and (isinstance(func.value, cst.Call) or ctx.qualname(func.value) is None):
        method = func.attr.value
        if method == "half" and not original.args:
            advice = f"use {source(func.value)}.bfloat16()"
            ctx.report("TPU304", original, f"{source(original)} casts to float16: {advice}; {_WHY}", fixable=False)
        elif method in _CASTS:
            _report_dtype_arg(ctx, original, [arg for arg in original.args if arg.keyword is None])
    elif ctx.qualname(original) == "torch.set_default_dtype":
        _report_dtype_arg(ctx, original, list(original.args[:1]))
    elif ctx.qualname(original) in AUTOCASTS:
        _device_agnostic_autocast(ctx, original)
    return updated


def _device_agnostic_autocast(ctx: PyContext, original: cst.Call) -> None:
    """``torch.autocast(device.type, dtype=torch.float16)``: autocast on the accelerator in use, whatever it is,
    so in float16 on TPU too (TPU301 rewrites only CUDA's autocast, whose device says "cuda"; a CPU autocast is
    no TPU matter). Reported like a cast: the dtype is the code's choice for every accelerator."""
    device = positional(original, 0) or keyword(original, "device_type")
    if device is None or cuda_device_code(ctx, device.value) is not None or string_value(device.value) == "cpu":
        return
    dtype = keyword(original, "dtype") or positional(original, 1)
    name = _half_dtype(ctx, dtype.value) if dtype is not None and not dtype.star else None
    if dtype is None or name is None:
        return
    if name:
        advice = f"bind {name} to torch.bfloat16"
    else:
        advice = f"pass {arg_source(dtype.with_changes(value=dotted(f'{ctx.torch_name}.bfloat16')))}"
    message = f"{source(original)} autocasts to float16 on the accelerator in use, TPU included: {advice}; {_WHY}"
    ctx.report("TPU304", original, message, fixable=False)


def _report_dtype_arg(ctx: PyContext, original: cst.Call, positional: list[cst.Arg]) -> None:
    """Report ``original`` when its dtype (``dtype=`` or one of ``positional``) is float16."""
    dtype = keyword(original, "dtype")
    for arg in [*positional, *([dtype] if dtype is not None else [])]:
        if arg.star:
            continue
        name = _half_dtype(ctx, arg.value)
        if name is not None:
            _report(ctx, original, arg, name)
            return
