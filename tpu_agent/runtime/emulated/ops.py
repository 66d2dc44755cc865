"""Per-op behaviour of the emulated device, as data: which ops feed the MXU, which read data back to the host,
which may mix host and device tensors, and which TorchTPU does not implement.

The dispatcher (:mod:`tensor`) and the deferred executor (:mod:`deferred`) both consult these tables, so an op
behaves the same whether it runs at once or at a flush.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tpu_agent.runtime.emulated import cpu_gaps
from tpu_agent.runtime.emulated.flush_cause import FlushCause

aten = torch.ops.aten

# Ops whose tensor operands at these positions go through the MXU. TorchTPU rounds f32/f16 operands to bf16
# for one pass at Precision.DEFAULT; the emulation rounds them the same way before the CPU kernel runs.
MXU_OPERANDS: dict[torch._ops.OpOverload, tuple[int, ...]] = {
    aten.mm.default: (0, 1),
    aten.bmm.default: (0, 1),
    aten.addmm.default: (1, 2),
    aten._addmm_activation.default: (1, 2),
    aten.baddbmm.default: (1, 2),
    aten.addbmm.default: (1, 2),
    aten.addmv.default: (1, 2),
    aten.mv.default: (0, 1),
    aten.dot.default: (0, 1),
    aten.addr.default: (1, 2),
    aten.convolution.default: (0, 1),
    aten.convolution_backward.default: (0, 1, 2),
    aten._scaled_dot_product_flash_attention_for_cpu.default: (0, 1, 2),
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: (0, 1, 2, 3),
}

# Matmul-family ops whose two operands must share a dtype; TorchTPU checks this itself (reference §8.2).
SAME_DTYPE_OPERANDS: dict[torch._ops.OpOverload, tuple[str, int, int]] = {
    aten.mm.default: ("mm", 0, 1),
    aten.bmm.default: ("bmm", 0, 1),
    aten.addmm.default: ("addmm", 1, 2),
    aten.baddbmm.default: ("baddbmm", 1, 2),
    aten.mv.default: ("mv", 0, 1),
    aten.dot.default: ("dot", 0, 1),
}

# The out_dtype overloads (torch.bmm(a, b, out_dtype=...); CUDA-only kernels in torch, computed by cpu_gaps) go
# through the MXU like their default overloads, where this torch has them.
for _name, _operands in (("mm", (0, 1)), ("bmm", (0, 1)), ("addmm", (1, 2)), ("baddbmm", (1, 2))):
    _packet = getattr(aten, _name)
    if hasattr(_packet, "dtype"):
        MXU_OPERANDS[_packet.dtype] = _operands
        SAME_DTYPE_OPERANDS[_packet.dtype] = (_name, _operands[0], _operands[1])

# Ops that legitimately take host tensors next to device tensors (transfers, and host index tensors as CUDA allows).
MIXED_DEVICE_OK = frozenset(
    {
        aten.copy_.default,
        aten._copy_from.default,
        aten._to_copy.default,
        aten.index.Tensor,
        aten.index_put_.default,
        aten.index_put.default,
        aten._index_put_impl_.default,
        aten.set_.source_Tensor,
        aten.lift_fresh.default,
        aten.lift_fresh_copy.default,
    }
)


def _all_overloads(*names: str) -> frozenset:
    return frozenset(getattr(getattr(aten, n), o) for n in names for o in getattr(aten, n).overloads())


# In-place ops that change a tensor's shape or strides: the tpu tensor's own metadata must follow its data's.
METADATA_INPLACE_OPS = _all_overloads(
    "resize_", "resize_as_", "unsqueeze_", "squeeze_", "t_", "transpose_", "swapdims_", "swapaxes_", "as_strided_", "set_"
)  # fmt: skip

# In-place ops that may give a tensor more memory than it had (a wrapper is then rebuilt around its new data), and
# the one that frees or re-allocates it (FSDP2 under torch.compile): DeferAndFuse runs them when they are issued.
STORAGE_CHANGING_OPS = _all_overloads("resize_", "resize_as_", "set_") | {
    torch.ops.inductor.resize_storage_bytes_.default
}

# Ops that return data to the host, with the flush cause (and events.HostSync.op) they log.
HOST_READ_OPS: dict[torch._ops.OpOverload, FlushCause] = {
    aten._local_scalar_dense.default: FlushCause.ITEM,
    aten.equal.default: FlushCause.BOOL,
    aten.is_nonzero.default: FlushCause.BOOL,
}

# Ops whose output shape depends on values: DeferAndFuse must materialise their inputs to record them.
DATA_DEPENDENT_OPS = frozenset(
    {
        aten.nonzero.default,
        aten.nonzero_static.default,
        aten.masked_select.default,
        aten._unique2.default,
        aten.unique_dim.default,
        aten.unique_consecutive.default,
        aten.repeat_interleave.Tensor,
        aten.bincount.default,
    }
)

DEBUG_SKIP_FINITE_CHECK = frozenset(
    {
        # these produce non-finite values by definition or only move data
        aten.isinf.default,
        aten.isnan.default,
        aten.isfinite.default,
        aten.copy_.default,
        aten._to_copy.default,
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.empty_like.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
    }
)


@dataclass(frozen=True)
class UnsupportedRule:
    """A class of ops TorchTPU 0.2.0 cannot run, with the error it raises (reference §8.2, §9.2, §9.4)."""

    code: str
    name: str
    rationale: str
    example: str
    reference: str


UNSUPPORTED_RULES = {
    rule.code: rule
    for rule in (
        UnsupportedRule(
            "sparse",
            "sparse operators",
            "TorchTPU has no sparse layouts; only torch.tpu.ops.sparse_* embedding ops exist",
            "x.to_sparse() on a tpu tensor",
            "torchtpu_api.md §9.2",
        ),
        UnsupportedRule(
            "quantized",
            "quantized dtypes",
            "qint8/quint8/qint32 and packed sub-byte types are not TorchTPU dtypes",
            "torch.quantize_per_tensor(x_tpu, 0.1, 0, torch.qint8)",
            "torchtpu_api.md §9.4",
        ),
        UnsupportedRule(
            "complex32",
            "complex32 dtype",
            "ComplexHalf is not a TorchTPU dtype",
            "x_tpu.to(torch.complex32)",
            "torchtpu_api.md §9.4",
        ),
        UnsupportedRule(
            "fast-accum",
            "_scaled_mm use_fast_accum",
            "TorchTPU rejects use_fast_accum=True in _scaled_mm",
            "torch._scaled_mm(a, b, scale_a, scale_b, use_fast_accum=True)",
            "torchtpu_api.md §8.2",
        ),
        UnsupportedRule(
            "no-kernel",
            "ATen op without a TPU kernel",
            "Ops with no TorchTPU kernel fail unless the CPU fallback is enabled",
            "an op listed in NO_TPU_KERNEL",
            "torchtpu_api.md §9.2",
        ),
    )
}

# Dtypes TorchTPU cannot hold (reference §9.4).
QUANTIZED_DTYPES = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4})

# Ops with no TorchTPU kernel: the non-symmetric eigendecomposition, which XLA lowers only on CPU (JAX's linalg.eig
# is CPU-only for the same reason), and antialiased bilinear resizing (interpolate(..., antialias=True), torchvision
# v2's resize default), which public bug notes against torch_tpu 0.1-0.2 report as not implemented for tpu.
NO_TPU_KERNEL = frozenset(
    {
        aten.linalg_eig.default,
        aten._linalg_eigvals.default,
        aten._upsample_bilinear2d_aa.default,
        aten._upsample_bilinear2d_aa.vec,
        aten._upsample_bilinear2d_aa_backward.default,
    }
)


def not_implemented_message(op_name: str) -> str:
    return f"'{op_name}' is not implemented for TPU. Please file a feature request"


def fallback_message(op_name: str) -> str:
    return f"'{op_name}' is not implemented for TPU. Falling back to CPU"


# Functional collectives (DTensor, FSDP2, ``funcol``) and their waits. TorchTPU runs each eager collective in its
# own graph (reference §2.4), so DeferAndFuse runs them at once, after the pending graph: never later than the
# program issued them (a graph flushed at exit would meet a destroyed process group) and never fused.
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional"})

# Ops that move data between host and device: DeferAndFuse checks their device arguments before recording.
TRANSFER_OPS = frozenset({aten._to_copy.default, aten.copy_.default})


@dataclass(frozen=True, slots=True)
class OpPlan:
    """Everything the tables above say about one op, gathered once: the dispatcher reads this per call instead of
    probing each table (an ``OpOverload`` hashes in Python, several microseconds per lookup)."""

    func: Any
    call: Any  # the overload's C++ entry (``OpOverload._op``): calling it skips ``OpOverload.__call__``'s frame
    mxu_operands: tuple[int, ...] | None
    same_dtype: tuple[str, int, int] | None  # SAME_DTYPE_OPERANDS' entry: (op name, operand, operand)
    gap: Any  # the cpu_gaps.CpuGap that computes inputs the CPU kernel refuses, if any
    host_read: FlushCause | None  # the flush (and HostSync) cause when the op returns data to the host
    data_dependent: bool
    storage_changing: bool
    metadata_inplace: bool
    out_arguments: tuple[str, ...]  # the ``out=`` arguments an out variant writes (and may resize) in place
    mixed_device_ok: bool
    is_view: bool
    transfer: bool  # in TRANSFER_OPS: may move data between host and device
    collective: bool  # a functional collective or wait (COLLECTIVE_NAMESPACES)
    # DeferAndFuse records the op without looking further at its arguments (no transfer, view or host read
    # that may run it at once instead)
    plain_record: bool


_PLANS: dict[int, OpPlan] = {}


def plan_of(func: Any) -> OpPlan:
    """The plan of ``func``, keyed by identity (overloads are process-lifetime singletons; the plan holds it)."""
    plan = _PLANS.get(id(func))
    if plan is not None and plan.func is func:
        return plan
    host_read = HOST_READ_OPS.get(func)
    data_dependent = func in DATA_DEPENDENT_OPS
    storage_changing = func in STORAGE_CHANGING_OPS
    is_view = bool(getattr(func, "is_view", False))
    collective = getattr(func, "namespace", None) in COLLECTIVE_NAMESPACES
    plan = OpPlan(
        func=func,
        call=getattr(func, "_op", func),
        mxu_operands=MXU_OPERANDS.get(func),
        same_dtype=SAME_DTYPE_OPERANDS.get(func),
        gap=cpu_gaps.BY_OP.get(func),
        host_read=host_read,
        data_dependent=data_dependent,
        storage_changing=storage_changing,
        metadata_inplace=func in METADATA_INPLACE_OPS,
        out_arguments=tuple(a.name for a in func._schema.arguments if a.is_out) if hasattr(func, "_schema") else (),
        mixed_device_ok=func in MIXED_DEVICE_OK,
        is_view=is_view,
        transfer=func in TRANSFER_OPS,
        collective=collective,
        plain_record=not (
            host_read or data_dependent or storage_changing or is_view or collective or func in TRANSFER_OPS
        ),
    )
    _PLANS[id(func)] = plan
    return plan
