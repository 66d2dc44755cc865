"""TPU3xx: automatic mixed precision: ``torch.cuda.amp.*``, ``autocast("cuda", float16)``, ``GradScaler``.

TorchTPU's autocast runs in bfloat16 (float16 is not a native TPU type), and bf16 needs no loss scaling. The
rewrite therefore produces device-agnostic ``torch.autocast(<device type>, dtype=torch.bfloat16)``, which is
also what CPU autocast runs, and turns the scaler into a pass-through only with ``--unsafe-fixes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety
from tpu_agent.migrate.rules._base import Family
from tpu_agent.migrate.rules._cst import (
    append_args,
    arg_position,
    call,
    keep_parens,
    keyword,
    kwarg,
    positional,
    prepend_args,
    replace_arg_value,
    source,
    string_value,
)
from tpu_agent.migrate.rules.devices import cuda_device_code
from tpu_agent.migrate.rules.references import AMP

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY = Family("amp")

FAMILY.rule(
    code="TPU301",
    name="cuda-autocast",
    safety=Safety.SAFE,
    summary='CUDA autocast: torch.cuda.amp.autocast(...), torch.autocast("cuda", ...), float16 autocast.',
    rationale="TorchTPU registers autocast for 'tpu' with bfloat16 (float16 is not native on TPU); the device-agnostic "
    "torch.autocast with bf16 runs on TPU, CUDA (Ampere and newer) and CPU. torch.cuda.amp.autocast is "
    "deprecated since torch 2.4.",
    before="with torch.cuda.amp.autocast():\n    loss = model(x)",
    after="with torch.autocast(DEVICE.type, dtype=torch.bfloat16):\n    loss = model(x)",
    references=(AMP,),
    since_torch="2.4",
    apis=(
        ApiEquivalent("torch.cuda.amp.autocast()", "torch.autocast(DEVICE.type, dtype=torch.bfloat16)"),
        ApiEquivalent(
            "torch.autocast(\"cuda\", dtype=torch.float16)",
            "torch.autocast(DEVICE.type, dtype=torch.bfloat16)",
        ),
    ),
)
FAMILY.rule(
    code="TPU302",
    name="cuda-grad-scaler",
    safety=Safety.UNSAFE,
    summary="A CUDA GradScaler: torch.cuda.amp.GradScaler(), torch.amp.GradScaler(\"cuda\").",
    rationale="Loss scaling exists for float16; with bf16 autocast it is not needed, and TorchTPU does not document a "
    "TPU scaler. The fix keeps the scale/step/update calls but makes the scaler a pass-through (enabled=False); it "
    "assumes the autocast dtype is bf16 (TPU301).",
    before="scaler = torch.cuda.amp.GradScaler()",
    after="scaler = torch.amp.GradScaler(DEVICE.type, enabled=False)",
    references=(AMP,),
    since_torch="2.3",
    apis=(
        ApiEquivalent("torch.cuda.amp.GradScaler()", "torch.amp.GradScaler(DEVICE.type, enabled=False)"),
        ApiEquivalent("torch.amp.GradScaler(\"cuda\")", "torch.amp.GradScaler(DEVICE.type, enabled=False)"),
    ),
)
FAMILY.rule(
    code="TPU303",
    name="cuda-amp-custom-fwd",
    safety=Safety.SAFE,
    summary="torch.cuda.amp.custom_fwd / custom_bwd decorators.",
    rationale="torch.amp.custom_fwd/custom_bwd take the device type, so the same autograd function works on every "
    "device.",
    before="@torch.cuda.amp.custom_fwd\ndef forward(ctx, x): ...",
    after="@torch.amp.custom_fwd(device_type=DEVICE.type)\ndef forward(ctx, x): ...",
    references=(AMP,),
    since_torch="2.4",
    apis=(
        ApiEquivalent(
            "torch.cuda.amp.custom_fwd, torch.cuda.amp.custom_bwd",
            "torch.amp.custom_fwd(device_type=DEVICE.type), torch.amp.custom_bwd(device_type=DEVICE.type)",
        ),
    ),
)

_CUDA_AUTOCAST = "torch.cuda.amp.autocast"
_AUTOCASTS = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
_CUDA_SCALER = "torch.cuda.amp.GradScaler"
_SCALERS = frozenset({"torch.amp.GradScaler", "torch.GradScaler", "torch.amp.grad_scaler.GradScaler"})
_CUSTOM = frozenset({"torch.cuda.amp.custom_fwd", "torch.cuda.amp.custom_bwd"})
FAMILY.claim(*_AUTOCASTS, *_SCALERS, _CUDA_AUTOCAST, _CUDA_SCALER, *_CUSTOM)
_HALF = frozenset({"torch.float16", "torch.half"})
# torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True), by position
_CUDA_AUTOCAST_POSITIONS = ("enabled", "dtype", "cache_enabled")


def _bf16(ctx: PyContext) -> cst.BaseExpression:
    return ctx.torch_attr("bfloat16")


def _with_bf16(ctx: PyContext, new: cst.Call) -> cst.Call:
    """Force dtype=torch.bfloat16: replace a float16 dtype, add one when there is none (CUDA's default is fp16).

    ``new`` is the rewritten call, whose dtype (if any) is a keyword argument by now.
    """
    for i, arg in enumerate(new.args):
        if arg.keyword is not None and arg.keyword.value == "dtype":
            return replace_arg_value(new, i, _bf16(ctx)) if ctx.qualname(arg.value) in _HALF else new
    return append_args(new, [kwarg("dtype", _bf16(ctx))])


@FAMILY.leave(cst.Call)
def autocast_call(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    qualname = ctx.qualname(original)
    if qualname == _CUDA_AUTOCAST:
        def build() -> cst.Call:
            # positional arguments of the CUDA form become keywords; the device type goes first
            args = [
                kwarg(_CUDA_AUTOCAST_POSITIONS[i], arg.value).with_changes(comma=arg.comma)
                if arg.keyword is None and not arg.star and i < len(_CUDA_AUTOCAST_POSITIONS)
                else arg
                for i, arg in enumerate(updated.args)
            ]
            new = prepend_args(updated.with_changes(func=ctx.torch_attr("autocast"), args=args), [cst.Arg(ctx.device_type())])
            return _with_bf16(ctx, new)

        new = ctx.fix("TPU301", original, build, lambda n: f"{source(original)} -> {source(n)}")
        return keep_parens(original, new) if new is not None else updated
    if qualname in _AUTOCASTS:
        device = positional(original, 0) or keyword(original, "device_type")
        if device is None or not cuda_device_code(ctx, device.value):
            return updated
        index = arg_position(original, device)

        device_value = device.value

        def build_generic() -> cst.Call:
            new = replace_arg_value(updated, index, ctx.device_type(device_value))
            return _with_bf16(ctx, new)

        new = ctx.fix("TPU301", original, build_generic, lambda n: f"{source(original)} -> {source(n)}")
        return new if new is not None else updated
    if qualname == _CUDA_SCALER or qualname in _SCALERS:
        if qualname in _SCALERS:
            device = positional(original, 0) or keyword(original, "device")
            if device is None or string_value(device.value) != "cuda":
                return updated

        def build_scaler() -> cst.Call:
            return call(ctx.torch_attr("amp.GradScaler"), [cst.Arg(ctx.device_type()), kwarg("enabled", cst.Name("False"))])

        new = ctx.fix(
            "TPU302",
            original,
            build_scaler,
            lambda n: f"{source(original)} -> {source(n)}: bf16 autocast needs no loss scaling",
        )
        return keep_parens(original, new) if new is not None else updated
    if qualname in _CUSTOM:
        kind = qualname.rpartition(".")[2]

        def build_custom() -> cst.Call:
            return prepend_args(updated.with_changes(func=ctx.torch_attr(f"amp.{kind}")), [kwarg("device_type", ctx.device_type())])

        new = ctx.fix("TPU303", original, build_custom, lambda n: f"{source(original)} -> {source(n)}")
        return new if new is not None else updated
    return updated


@FAMILY.reference("torch.cuda.amp")
def amp_reference(ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str) -> cst.BaseExpression:
    if ctx.is_call_func(original):
        return updated  # the call handler above rewrites the call as a whole
    if qualname in _CUSTOM:  # bare decorator: @torch.cuda.amp.custom_fwd
        kind = qualname.rpartition(".")[2]
        new = ctx.fix(
            "TPU303",
            original,
            lambda: call(ctx.torch_attr(f"amp.{kind}"), [kwarg("device_type", ctx.device_type())]),
            lambda n: f"{qualname} -> {source(n)}",
        )
        return new if new is not None else updated
    code = "TPU302" if qualname == _CUDA_SCALER else "TPU301"
    ctx.report(code, original, f"{qualname} used as a value: switch to torch.autocast / torch.amp by hand", fixable=False)
    return updated
