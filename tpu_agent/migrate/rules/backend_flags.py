"""TPU6xx: cuDNN and CUDA backend flags: ``cudnn.benchmark``, ``cudnn.deterministic``, TF32 and SDPA knobs.

These settings only steer NVIDIA libraries. Performance-only knobs are removed; the two with a meaning beyond
CUDA map to their global equivalents: TF32 matmuls to ``torch.set_float32_matmul_precision`` (which TorchTPU
maps to its MXU pass count) and cuDNN determinism to ``torch.use_deterministic_algorithms``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.cstnodes import string_like
from tpu_agent.migrate.model import ApiEquivalent, Safety, Target
from tpu_agent.migrate.rules._base import Family
from tpu_agent.migrate.rules._cst import call, is_pure, source
from tpu_agent.migrate.rules.env_vars import keep_for_cuda
from tpu_agent.migrate.rules.references import BACKENDS, MATMUL_PRECISION

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY = Family("backend-flags")

FAMILY.rule(
    code="TPU601",
    name="cudnn-flags",
    safety=Safety.SAFE,
    summary="cuDNN tuning flags: torch.backends.cudnn.benchmark / enabled / allow_tf32, deterministic = False (for "
    "the tpu target, deterministic = any value that is read without side effects).",
    rationale="They select cuDNN algorithms and have no TPU meaning; removing them changes CUDA speed, never results "
    "(deterministic = False is the default). Code migrated for the tpu target no longer runs on CUDA, so there "
    "cudnn.deterministic = True (or a flag such as args.deterministic) is removed as well: TorchTPU never reads it, "
    "and its porting table maps it to nothing.",
    before="torch.backends.cudnn.benchmark = True",
    after="",
    references=(BACKENDS,),
    apis=(
        ApiEquivalent(
            "torch.backends.cudnn.benchmark, torch.backends.cudnn.enabled, torch.backends.cudnn.allow_tf32",
            "delete it",
        ),
    ),
)
FAMILY.rule(
    code="TPU602",
    name="cudnn-deterministic",
    safety=Safety.UNSAFE,
    summary="torch.backends.cudnn.deterministic = a value read with side effects (a call), or on a line shared with "
    "other statements (for the accelerator target).",
    rationale="The device-agnostic switch is torch.use_deterministic_algorithms(True); it is stricter (it raises on "
    "operations without a deterministic implementation), hence unsafe. When the flag's value is read without side "
    "effects, the accelerator target keeps it for CUDA runs behind a not-TPU guard instead (TPU709) and the tpu "
    "target removes it (TPU601).",
    before="torch.backends.cudnn.deterministic = deterministic_requested()",
    after="torch.use_deterministic_algorithms(deterministic_requested())",
    references=(BACKENDS,),
    since_torch="1.8",
    apis=(ApiEquivalent("torch.backends.cudnn.deterministic = True", "torch.use_deterministic_algorithms(True)"),),
)
FAMILY.rule(
    code="TPU603",
    name="tf32-matmul",
    safety=Safety.SAFE,
    summary="torch.backends.cuda.matmul.allow_tf32 = ...",
    rationale="TF32 is an NVIDIA format; torch.set_float32_matmul_precision is the global form, and both targets "
    "write the same value. True becomes 'medium': on CUDA it allows TF32 exactly as 'high' does (cuBLAS has no bf16 "
    "path for float32 matmuls), and TorchTPU maps it to Precision.DEFAULT, the 1-pass bf16 MXU mode that is the TPU "
    "default and what its porting guide gives for allow_tf32 = True; 'high' would ask TorchTPU for 3-pass matmuls, "
    "slower than the default the flag meant to allow. (oneDNN may also use bf16 for float32 matmuls on CPUs with "
    "bf16 units: the reduced precision the flag accepted.) False becomes 'highest', full float32 everywhere "
    "(6-pass on TPU).",
    before="torch.backends.cuda.matmul.allow_tf32 = True",
    after='torch.set_float32_matmul_precision("medium")',
    references=(MATMUL_PRECISION,),
    since_torch="1.12",
    apis=(
        ApiEquivalent(
            "torch.backends.cuda.matmul.allow_tf32 = True / False",
            'torch.set_float32_matmul_precision("medium") / ("highest")',
        ),
    ),
)
FAMILY.rule(
    code="TPU604",
    name="cuda-backend-knobs",
    safety=Safety.SAFE,
    summary="CUDA-only kernel knobs: enable_flash_sdp / enable_mem_efficient_sdp / enable_math_sdp / enable_cudnn_sdp, "
    "preferred_linalg_library, reduced-precision reduction flags.",
    rationale="They choose among NVIDIA kernels; TorchTPU lowers attention and linear algebra through XLA, so they "
    "are removed.",
    before="torch.backends.cuda.enable_flash_sdp(True)",
    after="",
    references=(BACKENDS,),
    apis=(
        ApiEquivalent(
            "torch.backends.cuda.enable_flash_sdp(), enable_mem_efficient_sdp(), preferred_linalg_library()",
            "delete it: XLA chooses the kernels",
        ),
    ),
)
FAMILY.rule(
    code="TPU605",
    name="cuda-backend-other",
    safety=Safety.MANUAL,
    summary="Other torch.backends.cuda / torch.backends.cudnn uses: sdp_kernel contexts, cudnn.is_available(), "
    "version().",
    rationale="These read or scope NVIDIA library state; on TPU drop them or guard them with DEVICE.type == 'cuda'.",
    before="with torch.backends.cuda.sdp_kernel(enable_flash=True):",
    after="with torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # or drop it on TPU",
    references=(BACKENDS,),
    apis=(
        ApiEquivalent(
            "torch.backends.cuda.sdp_kernel(), torch.backends.cudnn.is_available(), torch.backends.cudnn.version()",
            "torch.nn.attention.sdpa_kernel(...), or drop it on TPU",
        ),
    ),
)

_REMOVE_FLAGS = {
    "torch.backends.cudnn.benchmark": "TPU601",
    "torch.backends.cudnn.enabled": "TPU601",
    "torch.backends.cudnn.allow_tf32": "TPU601",
    "torch.backends.cudnn.benchmark_limit": "TPU601",
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": "TPU604",
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": "TPU604",
}
_REMOVE_CALLS = frozenset(
    f"torch.backends.cuda.{name}"
    for name in (
        "enable_flash_sdp",
        "enable_mem_efficient_sdp",
        "enable_math_sdp",
        "enable_cudnn_sdp",
        "preferred_linalg_library",
        "preferred_blas_library",
    )
)
_PREFIXES = ("torch.backends.cudnn", "torch.backends.cuda")


def _literal_bool(node: cst.BaseExpression) -> bool | None:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


def _no_meaning(ctx: PyContext, assignment: cst.Assign) -> bool:
    """Whether ``torch.backends.cudnn.deterministic = <value>`` means nothing where the migrated code runs: False is
    cuDNN's default anywhere; on the tpu target any value does (cuDNN is never used), when reading it has no side
    effect to keep (``args.torch_deterministic``, ``True``; not ``parse_flag()``)."""
    if _literal_bool(assignment.value) is False:
        return True
    return ctx.target is Target.TPU and is_pure(ctx, assignment.value)


@FAMILY.leave(cst.Assign)
def flag_assignment(
    ctx: PyContext, original: cst.Assign, updated: cst.Assign
) -> cst.BaseSmallStatement | cst.RemovalSentinel:
    if len(original.targets) != 1:
        return updated
    qualname = ctx.qualname(original.targets[0].target)
    if qualname is None or not qualname.startswith(_PREFIXES):
        return updated
    value = _literal_bool(original.value)
    shown = source(original)
    if qualname in _REMOVE_FLAGS or (qualname == "torch.backends.cudnn.deterministic" and _no_meaning(ctx, original)):
        code = _REMOVE_FLAGS.get(qualname, "TPU601")
        if ctx.report(code, original, f"removed `{shown}`: no meaning outside cuDNN/cuBLAS"):
            return cst.RemovalSentinel.REMOVE
        return updated
    if qualname == "torch.backends.cudnn.deterministic":
        if is_pure(ctx, original.value) and keep_for_cuda(ctx, original, "cuDNN determinism"):
            return updated
        new = ctx.fix(
            "TPU602",
            original,
            lambda: cst.Expr(call(ctx.torch_attr("use_deterministic_algorithms"), [cst.Arg(updated.value)])),
            lambda n: f"`{shown}` -> `{source(n)}`",
        )
        return new if new is not None else updated
    if qualname == "torch.backends.cuda.matmul.allow_tf32":
        new = ctx.fix(
            "TPU603",
            original,
            lambda: _matmul_precision(ctx, updated.value, value),
            lambda n: f"`{shown}` -> `{source(n)}`",
        )
        return new if new is not None else updated
    ctx.report("TPU605", original, f"`{shown}`: CUDA library setting; remove it or guard it for CUDA runs")
    return updated


_FAST_MATMULS = "medium"  # TF32 on CUDA, TorchTPU's 1-pass bf16 default (see TPU603's rationale)


def _matmul_precision(ctx: PyContext, value: cst.BaseExpression, literal: bool | None) -> cst.Expr:
    if literal is None:
        arg: cst.BaseExpression = cst.IfExp(
            test=value, body=string_like(None, _FAST_MATMULS), orelse=string_like(None, "highest")
        )
    else:
        arg = string_like(None, _FAST_MATMULS if literal else "highest")
    return cst.Expr(call(ctx.torch_attr("set_float32_matmul_precision"), [cst.Arg(arg)]))


@FAMILY.visit(cst.Expr)
def _claim_knob_call(ctx: PyContext, node: cst.Expr) -> None:
    if isinstance(node.value, cst.Call) and ctx.qualname(node.value) in _REMOVE_CALLS:
        ctx.claim(node.value.func)


@FAMILY.leave(cst.Expr)
def knob_call(ctx: PyContext, original: cst.Expr, updated: cst.Expr) -> cst.Expr | cst.RemovalSentinel:
    if isinstance(original.value, cst.Call) and ctx.qualname(original.value) in _REMOVE_CALLS:
        if ctx.report("TPU604", original, f"removed `{source(original)}`: NVIDIA kernel selection"):
            return cst.RemovalSentinel.REMOVE
    return updated


@FAMILY.reference(*_PREFIXES)
def backend_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    if qualname in _REMOVE_CALLS:
        ctx.report("TPU604", original, f"{qualname}: NVIDIA kernel selection; remove it", fixable=False)
    elif qualname.endswith(("cudnn.is_available", "cudnn.version", "cuda.is_built")):
        ctx.report(
            "TPU208", original, f"{qualname}: a CUDA capability check; guard with DEVICE.type == 'cuda' or remove it"
        )
    elif qualname == "torch.backends.cuda.sdp_kernel":
        ctx.report("TPU605", original, "sdp_kernel: use torch.nn.attention.sdpa_kernel, or drop it on TPU")
    else:
        ctx.report("TPU605", original, f"{qualname}: CUDA library setting; remove it or guard it for CUDA runs")
    return updated
