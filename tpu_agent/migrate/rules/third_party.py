"""TPU8xx: what cannot move by rewriting: CUDA extensions, Triton, flash-attn/xformers, apex, bitsandbytes,
CuPy, DeepSpeed, NVML and CUDA container images.

Every rule here is MANUAL: the tool inventories each import and each call site (and ``.cu``/``.cuh`` files)
with what to use on TPU, and with ``--annotate`` leaves a ``# TODO(tpu-agent CODE)`` comment above it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from tpu_agent.migrate.model import ApiEquivalent, FileKind, Safety
from tpu_agent.migrate.rules._base import TEXT_KINDS, Family, TextFix
from tpu_agent.migrate.rules.references import (
    ACCELERATOR,
    AMP,
    CLOUD_TPU_PYTORCH,
    CPP_EXTENSION,
    DDP,
    FSDP2,
    SDPA,
    TORCH_TPU,
)

if TYPE_CHECKING:
    from tpu_agent.migrate.engine.context import PyContext

FAMILY = Family("third-party")

_ADVICE = {
    "TPU801": "custom CUDA/C++ extension: reimplement the op in PyTorch ops, or as a Pallas kernel registered with "
    "torch.tpu.pallas.jax_op",
    "TPU802": "Triton kernel: port it to Pallas (torch.tpu.pallas.jax_op) or write it in PyTorch ops under "
    'torch.compile(backend="tpu")',
    "TPU803": "flash-attn/xformers kernels are CUDA-only: use torch.nn.functional.scaled_dot_product_attention "
    "(B, H, S, D layout) or torch.tpu.ops.splash_sdpa for long sequences",
    "TPU804": "apex is CUDA-only: use torch.autocast (bf16), torch.nn.parallel.DistributedDataParallel, "
    "torch.optim.AdamW and nn.LayerNorm / nn.RMSNorm",
    "TPU805": "bitsandbytes kernels are CUDA-only: use bf16 weights and optimizers, or a torchao alternative",
    "TPU806": "CuPy runs only on CUDA: express the computation in torch ops",
    "TPU807": "DeepSpeed's CUDA ops and its torch_xla-based TPU accelerator do not use TorchTPU: use FSDP2 "
    "(torch.distributed.fsdp.fully_shard) with the tpu_dist backend",
    "TPU808": "NVML / nvidia-smi do not exist on TPU: use torch.accelerator.device_count(), "
    "torch.accelerator.memory_stats() or tpu-agent profile",
    "TPU809": "CUDA container or GPU scheduling setting: use a TPU VM image with torch_tpu installed and request "
    "TPU resources (google.com/tpu)",
}

FAMILY.rule(
    code="TPU801",
    name="cuda-extension",
    safety=Safety.MANUAL,
    summary="Custom CUDA/C++ extensions: torch.utils.cpp_extension (load, load_inline, CUDAExtension), "
    "torch.ops.load_library, .cu/.cuh sources.",
    rationale=_ADVICE["TPU801"],
    before='ext = load_inline("ops", cpp_sources=src, cuda_sources=kernel)',
    after="# TODO(tpu-agent TPU801): reimplement as a Pallas kernel (torch.tpu.pallas.jax_op)",
    references=(CPP_EXTENSION, TORCH_TPU),
    apis=(
        ApiEquivalent(
            "torch.utils.cpp_extension.load, load_inline, CUDAExtension, torch.ops.load_library, .cu/.cuh files",
            _ADVICE["TPU801"],
        ),
    ),
)
FAMILY.rule(
    code="TPU802",
    name="triton-kernel",
    safety=Safety.MANUAL,
    summary="Triton kernels: import triton, @triton.jit, @triton.autotune.",
    rationale=_ADVICE["TPU802"],
    before="@triton.jit\ndef add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr): ...",
    after="# TODO(tpu-agent TPU802): port to Pallas (torch.tpu.pallas.jax_op)",
    references=(TORCH_TPU,),
    apis=(ApiEquivalent("import triton, @triton.jit, @triton.autotune", _ADVICE["TPU802"]),),
)
FAMILY.rule(
    code="TPU803",
    name="flash-attention-kernels",
    safety=Safety.MANUAL,
    summary="flash_attn and xformers attention kernels.",
    rationale=_ADVICE["TPU803"],
    before="out = flash_attn_func(q, k, v, causal=True)",
    after="out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "
    "is_causal=True).transpose(1, 2)",
    references=(SDPA,),
    apis=(ApiEquivalent("flash_attn.flash_attn_func, xformers.ops.memory_efficient_attention", _ADVICE["TPU803"]),),
)
FAMILY.rule(
    code="TPU804",
    name="apex",
    safety=Safety.MANUAL,
    summary="NVIDIA apex (amp, FusedAdam, FusedLayerNorm, apex DDP).",
    rationale=_ADVICE["TPU804"],
    before="from apex import amp",
    after="torch.autocast / torch.optim.AdamW",
    references=(AMP, DDP),
    apis=(
        ApiEquivalent(
            "apex.amp, apex.optimizers.FusedAdam, apex.normalization.FusedLayerNorm, apex.parallel",
            _ADVICE["TPU804"],
        ),
    ),
)
FAMILY.rule(
    code="TPU805",
    name="bitsandbytes",
    safety=Safety.MANUAL,
    summary="bitsandbytes 8-bit/4-bit optimizers and layers.",
    rationale=_ADVICE["TPU805"],
    before="import bitsandbytes as bnb",
    after="torch.optim.AdamW with bf16",
    references=(AMP,),
    apis=(ApiEquivalent("bitsandbytes optimizers and layers", _ADVICE["TPU805"]),),
)
FAMILY.rule(
    code="TPU806",
    name="cupy",
    safety=Safety.MANUAL,
    summary="CuPy arrays and kernels.",
    rationale=_ADVICE["TPU806"],
    before="import cupy as cp",
    after="torch ops on DEVICE",
    references=(ACCELERATOR,),
    apis=(ApiEquivalent("cupy, cupyx", _ADVICE["TPU806"]),),
)
FAMILY.rule(
    code="TPU807",
    name="deepspeed",
    safety=Safety.MANUAL,
    summary="DeepSpeed engines and CUDA ops.",
    rationale=_ADVICE["TPU807"],
    before="import deepspeed",
    after="torch.distributed.fsdp.fully_shard",
    references=(FSDP2,),
    apis=(ApiEquivalent("deepspeed.initialize, DeepSpeed CUDA ops", _ADVICE["TPU807"]),),
)
FAMILY.rule(
    code="TPU808",
    name="nvidia-tools",
    safety=Safety.MANUAL,
    summary="NVML bindings and GPU monitoring: pynvml, GPUtil, nvidia_smi.",
    rationale=_ADVICE["TPU808"],
    before="import pynvml",
    after="torch.accelerator.memory_stats()",
    references=(ACCELERATOR,),
    apis=(ApiEquivalent("pynvml, GPUtil, nvidia_smi, nvidia-smi", _ADVICE["TPU808"]),),
)
FAMILY.rule(
    code="TPU809",
    name="cuda-container",
    safety=Safety.MANUAL,
    summary="CUDA container images and GPU scheduling: FROM nvidia/cuda, docker --gpus, nvidia.com/gpu.",
    rationale=_ADVICE["TPU809"],
    before="FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04",
    after="# a TPU VM image with torch_tpu installed",
    references=(CLOUD_TPU_PYTORCH,),
    apis=(ApiEquivalent("FROM nvidia/cuda, docker --gpus, nvidia.com/gpu", _ADVICE["TPU809"]),),
)

# top-level module (or dotted prefix) -> rule, for imports and call sites
_MODULES = {
    "torch.utils.cpp_extension": "TPU801",
    "triton": "TPU802",
    "flash_attn": "TPU803",
    "xformers": "TPU803",
    "apex": "TPU804",
    "bitsandbytes": "TPU805",
    "cupy": "TPU806",
    "cupyx": "TPU806",
    "deepspeed": "TPU807",
    "pynvml": "TPU808",
    "GPUtil": "TPU808",
    "nvidia_smi": "TPU808",
}


def _module_code(module: str) -> str | None:
    name = module
    while name:
        if name in _MODULES:
            return _MODULES[name]
        name = name.rpartition(".")[0]
    return None


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return node.value if isinstance(node, cst.Name) else ""


@FAMILY.leave(cst.Import)
def third_party_import(ctx: PyContext, original: cst.Import, updated: cst.Import) -> cst.Import:
    for alias in original.names:
        module = _dotted(alias.name)
        code = _module_code(module)
        if code is not None:
            ctx.report(code, original, f"import {module}: {_ADVICE[code]}")
    return updated


@FAMILY.leave(cst.ImportFrom)
def third_party_import_from(ctx: PyContext, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
    if original.module is None or original.relative:
        return updated
    module = _dotted(original.module)
    code = _module_code(module)
    if code is None and not isinstance(original.names, cst.ImportStar):
        code = next((c for c in (_module_code(f"{module}.{_dotted(a.name)}") for a in original.names) if c), None)
    if code is not None:
        ctx.report(code, original, f"from {module} import ...: {_ADVICE[code]}")
    return updated


_KERNEL_DECORATORS = ("triton.jit", "triton.autotune", "triton.heuristics")


@FAMILY.reference(*_MODULES, *_KERNEL_DECORATORS, "torch.ops.load_library")
def third_party_reference(
    ctx: PyContext, original: cst.BaseExpression, updated: cst.BaseExpression, qualname: str
) -> cst.BaseExpression:
    # call sites and kernel decorators; other uses (attribute reads, tl.* inside kernels) would only repeat them
    is_kernel = qualname in _KERNEL_DECORATORS
    if qualname.startswith("triton.language"):
        return updated
    if is_kernel or ctx.is_call_func(original):
        code = "TPU802" if is_kernel else "TPU801" if qualname == "torch.ops.load_library" else _module_code(qualname)
        if code is not None:
            ctx.report(code, original, f"{qualname}: {_ADVICE[code]}")
    return updated


FAMILY.text(
    TextFix(
        code="TPU809",
        kinds=TEXT_KINDS,
        pattern=re.compile(r"(?<=FROM )(?:--platform=\S+ )?(?:nvidia/cuda|nvcr\.io/)\S*|--gpus\b|nvidia\.com/gpu"),
        replace=lambda ctx, m: None,
        message=lambda ctx, m: f"{m.group(0)}: {_ADVICE['TPU809']}",
    )
)

_KERNEL_RE = re.compile(rb"__global__\s+\w+[\s*]+(\w+)\s*\(")
_OP_RE = re.compile(rb"(?:TORCH_LIBRARY(?:_IMPL)?|PYBIND11_MODULE)\s*\(\s*(\w+)")


@FAMILY.whole_file("TPU801", FileKind.CUDA_SOURCE)
def cuda_source_message(data: bytes) -> str:
    """The inventory line for a ``.cu``/``.cuh`` file: its kernels and the op libraries it registers."""
    kernels = sorted({m.decode("ascii", "replace") for m in _KERNEL_RE.findall(data)})
    libraries = sorted({m.decode("ascii", "replace") for m in _OP_RE.findall(data)})
    parts = [f"{len(kernels)} CUDA kernel(s)" + (f" ({', '.join(kernels[:8])})" if kernels else "")]
    if libraries:
        parts.append(f"registers {', '.join(libraries)}")
    return f"CUDA source: {'; '.join(parts)}: {_ADVICE['TPU801']}"
