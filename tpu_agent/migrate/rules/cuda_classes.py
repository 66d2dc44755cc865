"""Older CUDA API classes with a device-agnostic form: legacy tensor types, ``sdp_kernel``, stream contexts, bf16.

Kept apart from :mod:`~tpu_agent.migrate.rules.cuda_api` (the ``torch.cuda`` name table) because each of
these rewrites reads the call's arguments: a legacy constructor is a size or data by its arguments, an
``sdp_kernel`` becomes ``sdpa_kernel`` only for literal flags, a stream context only around a stream object.
Handlers claim the function they rewrite so that the name-table rules do not report it a second time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, Safety, Target
from tpu_agent.migrate.rules import backend_flags, cuda_api
from tpu_agent.migrate.rules._cst import (
    keep_parens,
    keyword,
    kwarg,
    positional,
    refuse_unpacked,
    source,
    string_value,
)
from tpu_agent.migrate.rules.references import DEVICE, SDPA, TORCH_TPU

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

cuda_api.FAMILY.rule(
    code="TPU213",
    name="cuda-legacy-tensor-type",
    safety=Safety.SAFE,
    summary="Legacy CUDA tensor types: torch.cuda.FloatTensor(2, 3), torch.cuda.LongTensor([1, 2]), "
    "x.type(torch.cuda.HalfTensor).",
    rationale="The typed constructors exist only for CUDA. A size becomes torch.empty and data torch.tensor with "
    "the type's dtype on the device in use; x.type(T) becomes x.to(device, dtype). A constructor whose single "
    "argument could be a size or data, and isinstance checks, are reported.",
    before="buf = torch.cuda.FloatTensor(4, 8)\nidx = torch.cuda.LongTensor([0, 2])\nx = x.type(torch.cuda.HalfTensor)",
    after="buf = torch.empty(4, 8, dtype=torch.float32, device=DEVICE)\n"
    "idx = torch.tensor([0, 2], dtype=torch.int64, device=DEVICE)\nx = x.to(device=DEVICE, dtype=torch.float16)",
    references=("https://docs.pytorch.org/docs/stable/tensors.html", DEVICE),
    apis=(
        ApiEquivalent("torch.cuda.FloatTensor(n, m)", "torch.empty(n, m, dtype=torch.float32, device=DEVICE)"),
        ApiEquivalent("torch.cuda.LongTensor([...])", "torch.tensor([...], dtype=torch.int64, device=DEVICE)"),
        ApiEquivalent("x.type(torch.cuda.HalfTensor)", "x.to(device=DEVICE, dtype=torch.float16)"),
    ),
)
cuda_api.FAMILY.rule(
    code="TPU214",
    name="bf16-support-check",
    safety=Safety.SAFE,
    summary="torch.cuda.is_bf16_supported().",
    rationale="bf16 is native on every TPU, so for the tpu target the check is True. torch 2.13 has no "
    "device-agnostic query, and the CUDA check alone is False on a TPU host (a script would fall back to float16), "
    'so for the accelerator target it becomes (DEVICE.type == "tpu" or <the CUDA check>).',
    before="dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16",
    after='dtype = torch.bfloat16 if (DEVICE.type == "tpu" or torch.cuda.is_bf16_supported()) else torch.float16',
    references=("https://github.com/huggingface/transformers/pull/45918", TORCH_TPU),
    apis=(
        ApiEquivalent(
            "torch.cuda.is_bf16_supported()",
            '(DEVICE.type == "tpu" or torch.cuda.is_bf16_supported()); True (--target tpu)',
            "bf16 is native on TPU",
        ),
    ),
)
backend_flags.FAMILY.rule(
    code="TPU606",
    name="sdp-kernel-context",
    safety=Safety.SAFE,
    summary="with torch.backends.cuda.sdp_kernel(enable_flash=..., enable_math=..., enable_mem_efficient=...).",
    rationale="sdp_kernel is deprecated for torch.nn.attention.sdpa_kernel, which takes the list of allowed "
    "backends and works on every device. It is rewritten when the flags are literals and the math backend stays "
    "allowed (the one every device has, TorchTPU's F.scaled_dot_product_attention included); a context that "
    "allows only CUDA kernels is reported.",
    before="with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_mem_efficient=False):",
    after="with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION, "
    "torch.nn.attention.SDPBackend.MATH, torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):",
    references=("https://docs.pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html", SDPA),
    apis=(
        ApiEquivalent(
            "torch.backends.cuda.sdp_kernel(enable_flash=..., enable_math=True, ...)",
            "torch.nn.attention.sdpa_kernel([SDPBackend...])",
        ),
    ),
    since_torch="2.3",
)

_DTYPES = {
    "FloatTensor": "float32",
    "DoubleTensor": "float64",
    "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16",
    "LongTensor": "int64",
    "IntTensor": "int32",
    "ShortTensor": "int16",
    "CharTensor": "int8",
    "ByteTensor": "uint8",
    "BoolTensor": "bool",
}
_LEGACY = {f"torch.cuda.{name}": dtype for name, dtype in _DTYPES.items()}
_SDP_KERNEL = "torch.backends.cuda.sdp_kernel"
# sdp_kernel flag -> SDPBackend member, in sdp_kernel's argument order (every flag defaults to True)
_SDP_FLAGS = (
    ("enable_flash", "FLASH_ATTENTION"),
    ("enable_math", "MATH"),
    ("enable_mem_efficient", "EFFICIENT_ATTENTION"),
    ("enable_cudnn", "CUDNN_ATTENTION"),
)
_STREAM_CONTEXT = "torch.cuda.stream"


def _legacy_dtype(ctx: PyContext, node: cst.BaseExpression) -> str | None:
    return _LEGACY.get(ctx.qualname(node) or "")


@cuda_api.FAMILY.visit(cst.Call)
def _claim_rewritten_calls(ctx: PyContext, node: cst.Call) -> None:
    qualname = ctx.qualname(node)
    if qualname in _LEGACY or qualname in (_SDP_KERNEL, "torch.cuda.is_bf16_supported"):
        ctx.claim(node.func)
    elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "type" and len(node.args) == 1:
        if _legacy_dtype(ctx, node.args[0].value):
            ctx.claim(node.args[0].value)


@cuda_api.FAMILY.visit(cst.BooleanOperation)
def _claim_checked_bf16(ctx: PyContext, node: cst.BooleanOperation) -> None:
    # (DEVICE.type == "tpu" or torch.cuda.is_bf16_supported()) is what TPU214 writes: a second run keeps it
    left, right = node.left, node.right
    if (
        isinstance(node.operator, cst.Or)
        and isinstance(right, cst.Call)
        and ctx.qualname(right) == "torch.cuda.is_bf16_supported"
        and isinstance(left, cst.Comparison)
        and len(left.comparisons) == 1
        and isinstance(left.comparisons[0].operator, cst.Equal)
        and string_value(left.comparisons[0].comparator) == "tpu"
    ):
        ctx.claim(right)


@cuda_api.FAMILY.leave(cst.Call)
def legacy_and_capability_calls(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if type(updated) is not cst.Call:
        return updated
    qualname = ctx.qualname(original)
    if qualname in _LEGACY:
        return _legacy_constructor(ctx, original, updated, _LEGACY[qualname])
    if qualname == "torch.cuda.is_bf16_supported":
        if ctx.is_claimed(original):
            return updated
        new = ctx.fix(
            "TPU214",
            original,
            lambda: _bf16_supported(ctx, updated),
            lambda n: f"is_bf16_supported() -> {source(n)} (bf16 is native on TPU)",
        )
        return keep_parens(original, new) if new is not None else updated
    if qualname == _SDP_KERNEL:
        return _sdp_kernel(ctx, original, updated)
    func = original.func
    if isinstance(func, cst.Attribute) and func.attr.value == "type" and len(original.args) == 1 and qualname is None:
        dtype = _legacy_dtype(ctx, original.args[0].value)
        if dtype is not None:

            def build() -> cst.Call:
                return cst.Call(
                    func=updated.func.with_changes(attr=cst.Name("to")),
                    args=[kwarg("device", ctx.device_value()), kwarg("dtype", ctx.torch_attr(dtype))],
                )

            converted = ctx.fix("TPU213", original, build, lambda n: f"{source(original)} -> {source(n)}")
            return converted if converted is not None else updated
    return updated


def _bf16_supported(ctx: PyContext, updated: cst.Call) -> cst.BaseExpression:
    """``True`` for the tpu target; for the accelerator target ``(DEVICE.type == "tpu" or <the CUDA check>)``:
    left as it was, the check is False on a TPU host (no CUDA there), so ``"bfloat16" if
    torch.accelerator.is_available() and torch.cuda.is_bf16_supported() else "float16"`` (nanoGPT) would pick
    float16, which TPUs do not compute natively."""
    if ctx.target is Target.TPU:
        return cst.Name("True")
    on_tpu = cst.Comparison(
        left=ctx.device_type(), comparisons=[cst.ComparisonTarget(operator=cst.Equal(), comparator=ctx.string("tpu"))]
    )
    either = cst.BooleanOperation(left=on_tpu, operator=cst.Or(), right=updated)
    return either.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _legacy_constructor(ctx: PyContext, original: cst.Call, updated: cst.Call, dtype: str) -> cst.BaseExpression:
    args = list(updated.args)
    if any(a.keyword is not None or a.star for a in original.args):
        ctx.report(
            "TPU213",
            original,
            f"{source(original.func)} with keywords: build it with torch.empty/torch.tensor",
            fixable=False,
        )
        return updated
    values = [a.value for a in original.args]
    if len(values) == 1 and isinstance(values[0], (cst.List, cst.Tuple)):
        factory, new_args = "tensor", args
    elif not values or len(values) > 1 or isinstance(values[0], cst.Integer):
        factory, new_args = "empty", args or [cst.Arg(cst.Integer("0"))]
    else:
        ctx.report(
            "TPU213",
            original,
            f"{source(original)}: a size or data? use torch.empty(size, ...) or "
            f"torch.tensor(data, ...) with dtype=torch.{dtype}",
            fixable=False,
        )
        return updated

    def build() -> cst.Call:
        last = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in new_args]
        return cst.Call(
            func=ctx.torch_attr(factory),
            args=[*last, kwarg("dtype", ctx.torch_attr(dtype)), kwarg("device", ctx.device_value())],
        )

    new = ctx.fix(
        "TPU213",
        original,
        build,
        lambda n: f"{source(original.func)}(...) -> torch.{factory}(..., dtype=torch.{dtype})",
    )
    return keep_parens(original, new) if new is not None else updated


def _sdp_kernel(ctx: PyContext, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    if refuse_unpacked(ctx, "TPU606", original):
        return updated
    enabled: list[str] = []
    for index, (flag, member) in enumerate(_SDP_FLAGS):
        arg = keyword(original, flag) or positional(original, index)
        value = (
            arg.value.value if arg is not None and isinstance(arg.value, cst.Name) else "True" if arg is None else None
        )
        if value not in ("True", "False"):
            ctx.report(
                "TPU606",
                original,
                f"sdp_kernel({flag}={source(arg.value)}): flags must be literals to "  # type: ignore[union-attr]
                "choose the sdpa_kernel backends",
                fixable=False,
            )
            return updated
        if value == "True":
            enabled.append(member)
    if "MATH" not in enabled:
        ctx.report(
            "TPU606",
            original,
            f"sdp_kernel allows only CUDA kernels ({', '.join(enabled) or 'none'}): on TPU "
            "drop the context (TorchTPU runs F.scaled_dot_product_attention itself)",
            fixable=False,
        )
        return updated

    def build() -> cst.Call:
        backends = [cst.Element(ctx.torch_attr(f"nn.attention.SDPBackend.{m}")) for m in enabled]
        return cst.Call(func=ctx.torch_attr("nn.attention.sdpa_kernel"), args=[cst.Arg(cst.List(backends))])

    new = ctx.fix("TPU606", original, build, lambda n: f"sdp_kernel -> sdpa_kernel([{', '.join(enabled)}])")
    return keep_parens(original, new) if new is not None else updated


@cuda_api.FAMILY.visit(cst.WithItem)
def _claim_stream_context(ctx: PyContext, node: cst.WithItem) -> None:
    call = node.item
    if isinstance(call, cst.Call) and ctx.qualname(call) == _STREAM_CONTEXT and _stream_object(call) is not None:
        ctx.claim(call.func)


def _stream_object(call: cst.Call) -> cst.BaseExpression | None:
    arg = positional(call, 0) or keyword(call, "stream")
    if arg is None or len(call.args) != 1 or not isinstance(arg.value, (cst.Name, cst.Attribute)):
        return None
    if isinstance(arg.value, cst.Name) and arg.value.value == "None":
        return None
    return arg.value


@cuda_api.FAMILY.leave(cst.WithItem)
def stream_context(ctx: PyContext, original: cst.WithItem, updated: cst.WithItem) -> cst.WithItem:
    # with torch.cuda.stream(s):  ->  with s:  (torch.Stream is its own context manager)
    call = original.item
    if not (isinstance(call, cst.Call) and ctx.qualname(call) == _STREAM_CONTEXT):
        return updated
    stream = _stream_object(call)
    if stream is None:
        return updated
    new_stream = updated.item.args[0].value  # type: ignore[attr-defined]
    new = ctx.fix("TPU202", call, lambda: new_stream, lambda n: f"torch.cuda.stream({source(stream)}) -> {source(n)}")
    return updated.with_changes(item=new) if new is not None else updated
