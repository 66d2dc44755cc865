"""TPU3xx: automatic mixed precision: ``torch.cuda.amp.*``, ``autocast("cuda", float16)``, ``GradScaler``.

TorchTPU's autocast runs in bfloat16 (float16 is not a native TPU type), and bf16 needs no loss scaling. The
rewrite therefore produces device-agnostic ``torch.autocast(<device type>, dtype=torch.bfloat16)``, which is
also what CPU autocast runs, and turns the scaler into a pass-through only with ``--unsafe-fixes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety, Target
from tpu_agent.migrate.rules._base import Family
from tpu_agent.migrate.rules._cst import (
    append_args,
    call,
    keep_parens,
    keyword,
    kwarg,
    positional,
    prepend_args,
    refuse_unpacked,
    replace_arg_value,
    replace_original_arg,
    source,
    string_value,
)
from tpu_agent.migrate.rules.accelerator_guards import off_tpu
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
            'torch.autocast("cuda", dtype=torch.float16)',
            "torch.autocast(DEVICE.type, dtype=torch.bfloat16)",
        ),
    ),
)
FAMILY.rule(
    code="TPU302",
    name="cuda-grad-scaler",
    safety=Safety.SAFE,
    summary='A CUDA GradScaler: torch.cuda.amp.GradScaler(), torch.amp.GradScaler("cuda").',
    rationale="A CUDA GradScaler turns itself off (with a warning) wherever CUDA is absent, so on a TPU or CPU host "
    "the original is already a pass-through. The rewrite keeps that: it scales, with the user's arguments, on an "
    "accelerator other than TPU (CUDA) and is off on TPU and CPU; the scale/step/update calls keep working. "
    "TorchTPU documents no TPU scaler, and bf16 autocast (TPU301) needs no loss scaling.",
    before="scaler = torch.cuda.amp.GradScaler(enabled=args.amp)",
    after="scaler = torch.amp.GradScaler(\n"
    '    DEVICE.type, enabled=args.amp and torch.accelerator.is_available() and DEVICE.type != "tpu"\n)\n'
    '# --target tpu: scaler = torch.amp.GradScaler("tpu", enabled=False)',
    references=(AMP,),
    since_torch="2.3",
    apis=(
        ApiEquivalent(
            "torch.cuda.amp.GradScaler(enabled=e)",
            "torch.amp.GradScaler(DEVICE.type, "
            'enabled=e and torch.accelerator.is_available() and DEVICE.type != "tpu")',
        ),
        ApiEquivalent(
            'torch.amp.GradScaler("cuda")',
            'torch.amp.GradScaler(DEVICE.type, enabled=torch.accelerator.is_available() and DEVICE.type != "tpu")',
        ),
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
AUTOCASTS = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})
_CUDA_SCALER = "torch.cuda.amp.GradScaler"
_SCALERS = frozenset({"torch.amp.GradScaler", "torch.GradScaler", "torch.amp.grad_scaler.GradScaler"})
_CUSTOM = frozenset({"torch.cuda.amp.custom_fwd", "torch.cuda.amp.custom_bwd"})
FAMILY.claim(*AUTOCASTS, *_SCALERS, _CUDA_AUTOCAST, _CUDA_SCALER, *_CUSTOM)
_HALF = frozenset({"torch.float16", "torch.half"})
# torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True), by position
_CUDA_AUTOCAST_POSITIONS = ("enabled", "dtype", "cache_enabled")


def _bf16(ctx: PyContext) -> cst.BaseExpression:
    return ctx.torch_attr("bfloat16")


def _with_bf16(ctx: PyContext, new: cst.Call) -> cst.Call:
    """Force dtype=torch.bfloat16: replace a float16 dtype, add one when there is none (CUDA's default is fp16).

    ``new`` is the rewritten call, whose dtype (if any) is a keyword argument by now. A context that is off
    (``enabled=False``, lucidrains' ``@autocast('cuda', enabled = False)`` around f32-only code) casts nothing, so
    it keeps the dtype it has and gets none.
    """
    enabled = keyword(new, "enabled")
    if enabled is not None and isinstance(enabled.value, cst.Name) and enabled.value.value == "False":
        return new
    for i, arg in enumerate(new.args):
        if arg.keyword is not None and arg.keyword.value == "dtype":
            return replace_arg_value(new, i, _bf16(ctx)) if ctx.qualname(arg.value) in _HALF else new
    return append_args(new, [kwarg("dtype", _bf16(ctx))])


# torch.amp.GradScaler's parameters after the device, by position (torch.cuda.amp.GradScaler has no device)
_SCALER_POSITIONS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")


def _scaler(ctx: PyContext, updated: cst.Call, skip: int) -> cst.Call:
    """``torch.amp.GradScaler`` that scales where the CUDA one did, on CUDA with the user's arguments, and is off
    on TPU and CPU, as the CUDA one is there. (Spelled without "cuda", which would read as a CUDA check.)

    ``skip`` is 1 when the first positional argument is the device ("cuda"). The tpu target's scaler is off
    (a CUDA scaler on a TPU host is off too), so its other arguments do not matter."""
    if ctx.target is Target.TPU:
        return call(ctx.torch_attr("amp.GradScaler"), [cst.Arg(ctx.device_type()), kwarg("enabled", cst.Name("False"))])
    kept: list[cst.Arg] = []
    enabled: cst.BaseExpression | None = None
    position = 0
    for arg in updated.args:
        if arg.keyword is None:
            position += 1
            if position <= skip:
                continue
            name = _SCALER_POSITIONS[position - 1 - skip]
        else:
            name = arg.keyword.value
        if name == "enabled":
            enabled = arg.value
        elif name != "device":
            kept.append(kwarg(name, arg.value))
    on_cuda = off_tpu(ctx)  # where a scaler exists: CUDA (and other accelerators), not TPU or CPU
    if enabled is None or (isinstance(enabled, cst.Name) and enabled.value == "True"):
        switch: cst.BaseExpression = on_cuda
    elif isinstance(enabled, cst.Name) and enabled.value == "False":
        switch = enabled
    else:
        if isinstance(enabled, (cst.IfExp, cst.Lambda, cst.NamedExpr, cst.BooleanOperation)) and not enabled.lpar:
            enabled = enabled.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        switch = cst.BooleanOperation(left=enabled, operator=cst.And(), right=on_cuda)
    return call(ctx.torch_attr("amp.GradScaler"), [cst.Arg(ctx.device_type()), *kept, kwarg("enabled", switch)])


@FAMILY.leave(cst.Call)
def autocast_call(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    qualname = ctx.qualname(original)
    if qualname == _CUDA_AUTOCAST:
        if refuse_unpacked(ctx, "TPU301", original):
            return updated

        def build() -> cst.Call:
            # positional arguments of the CUDA form become keywords; the device type goes first
            args = [
                kwarg(_CUDA_AUTOCAST_POSITIONS[i], arg.value).with_changes(comma=arg.comma)
                if arg.keyword is None and not arg.star and i < len(_CUDA_AUTOCAST_POSITIONS)
                else arg
                for i, arg in enumerate(updated.args)
            ]
            new = prepend_args(
                updated.with_changes(func=ctx.torch_attr("autocast"), args=args), [cst.Arg(ctx.device_type())]
            )
            return _with_bf16(ctx, new)

        new = ctx.fix("TPU301", original, build, lambda n: f"{source(original)} -> {source(n)}")
        return keep_parens(original, new) if new is not None else updated
    if qualname in AUTOCASTS:
        device = positional(original, 0) or keyword(original, "device_type")
        if device is None or not cuda_device_code(ctx, device.value) or refuse_unpacked(ctx, "TPU301", original):
            return updated
        device_arg = device

        def build_generic() -> cst.Call:
            new = replace_original_arg(original, updated, device_arg, ctx.device_type(device_arg.value))
            return _with_bf16(ctx, new)

        new = ctx.fix("TPU301", original, build_generic, lambda n: f"{source(original)} -> {source(n)}")
        return new if new is not None else updated
    if qualname == _CUDA_SCALER or qualname in _SCALERS:
        if qualname in _SCALERS:
            device = positional(original, 0) or keyword(original, "device")
            if device is None or string_value(device.value) != "cuda":
                return updated

        if refuse_unpacked(ctx, "TPU302", original):
            return updated
        new = ctx.fix(
            "TPU302",
            original,
            lambda: _scaler(ctx, updated, skip=0 if qualname == _CUDA_SCALER else 1),
            lambda n: f"{source(original)} -> {source(n)}: the CUDA scaler turns itself off where CUDA is absent",
        )
        return keep_parens(original, new) if new is not None else updated
    if qualname in _CUSTOM:
        kind = qualname.rpartition(".")[2]

        def build_custom() -> cst.Call:
            return prepend_args(
                updated.with_changes(func=ctx.torch_attr(f"amp.{kind}")), [kwarg("device_type", ctx.device_type())]
            )

        new = ctx.fix("TPU303", original, build_custom, lambda n: f"{source(original)} -> {source(n)}")
        return new if new is not None else updated
    return updated


@FAMILY.reference("torch.cuda.amp")
def amp_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
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
    ctx.report(
        code, original, f"{qualname} used as a value: switch to torch.autocast / torch.amp by hand", fixable=False
    )
    return updated
