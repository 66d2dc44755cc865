"""Ops whose CPU kernel (or torch's shape function for it) refuses inputs that TorchTPU's (XLA's) kernels accept, and
how the emulation computes them instead: one record per gap, as data, so the table can be read, tested and extended.

The emulated device runs every op with the CPU's kernel. Where that kernel lacks a dtype the device has
(transformers' mixture-of-experts path calls ``torch.histc`` on int tensors on every device except cpu/mps),
the op must still work on ``tpu``: the record's ``compute`` gets the CPU arguments and returns the result the
device would, e.g. by upcasting to a dtype the CPU kernel takes and casting the result back (exact for the ops
listed: counts and nearest-neighbour copies of integers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

aten = torch.ops.aten

INTEGER_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
FLOAT_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})


@dataclass(frozen=True)
class CpuGap:
    """A class of inputs the CPU kernel of ``ops`` refuses, and the computation used instead."""

    name: str
    ops: tuple[Any, ...]
    refused_dtypes: frozenset[torch.dtype]
    compute: Callable[[Any, list, dict], Any]
    cpu_error: str  # what the CPU kernel says (never shown to users: the emulation computes instead)
    rationale: str


def _upcast_and_back(via: torch.dtype) -> Callable[[Any, list, dict], Any]:
    """Run ``func`` with its first tensor argument in ``via`` and return the result in the input's dtype."""

    def compute(func: Any, cargs: list, ckwargs: dict) -> Any:
        source = cargs[0]
        out = func(source.to(via), *cargs[1:], **ckwargs)
        return out.to(source.dtype)

    return compute


def _biased_gates(cargs: list, ckwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fused cell's ``(input_gates, hidden_gates, state, input_bias=None, hidden_bias=None)`` arguments as the
    input gates and hidden gates with their biases added, and the state (the LSTM's ``cx``, the GRU's ``hx``)."""
    input_gates, hidden_gates, state, input_bias, hidden_bias = [*cargs, *ckwargs.values(), None, None][:5]
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    return input_gates, hidden_gates, state


def _lstm_cell(func: Any, cargs: list, ckwargs: dict) -> Any:
    """``_thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias) -> (hy, cy, workspace)``
    from plain ops. The workspace is only read by :func:`_lstm_cell_backward`: here, the summed gates."""
    input_gates, hidden_gates, cx = _biased_gates(cargs, ckwargs)
    gates = input_gates + hidden_gates
    in_gate, forget_gate, cell_gate, out_gate = gates.chunk(4, 1)
    cy = forget_gate.sigmoid() * cx + in_gate.sigmoid() * cell_gate.tanh()
    return out_gate.sigmoid() * cy.tanh(), cy, gates


def _lstm_cell_backward(func: Any, cargs: list, ckwargs: dict) -> Any:
    """``_thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias)`` -> the gates', the
    cell state's and the bias's gradients, by torch's own differentiable formula over the summed gates."""
    grad_hy, grad_cy, cx, cy, gates, has_bias = [*cargs, *ckwargs.values()]
    grad_gates, _, grad_cx, _, _ = aten._thnn_differentiable_lstm_cell_backward(
        grad_hy, grad_cy, gates, torch.zeros_like(gates), None, None, cx, cy
    )
    return grad_gates, grad_cx, grad_gates.sum(0) if has_bias else torch.empty(0, dtype=gates.dtype)


def _gru_cell(func: Any, cargs: list, ckwargs: dict) -> Any:
    """``_thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias) -> (hy, workspace)`` from plain
    ops; the workspace (read by :func:`_gru_cell_backward` only) holds the biased gates and ``hx``."""
    input_gates, hidden_gates, hx = _biased_gates(cargs, ckwargs)
    input_reset, input_update, input_new = input_gates.chunk(3, 1)
    hidden_reset, hidden_update, hidden_new = hidden_gates.chunk(3, 1)
    reset = (input_reset + hidden_reset).sigmoid()
    update = (input_update + hidden_update).sigmoid()
    new = (input_new + reset * hidden_new).tanh()
    return (1 - update) * new + update * hx, torch.cat([input_gates, hidden_gates, hx], 1)


def _gru_cell_backward(func: Any, cargs: list, ckwargs: dict) -> Any:
    """``_thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)`` -> the gradients of both gates, ``hx`` and both
    biases, by torch's own differentiable formula over what the workspace kept."""
    grad_hy, workspace, has_bias = [*cargs, *ckwargs.values()]
    hidden = workspace.shape[1] // 7
    input_gates, hidden_gates, hx = workspace.split([3 * hidden, 3 * hidden, hidden], 1)
    grad_input, grad_hidden, grad_hx, _, _ = aten._thnn_differentiable_gru_cell_backward(
        grad_hy, input_gates, hidden_gates, hx, None, None
    )
    if not has_bias:
        return grad_input, grad_hidden, grad_hx, torch.empty(0), torch.empty(0)
    return grad_input, grad_hidden, grad_hx, grad_input.sum(0), grad_hidden.sum(0)


def _cuda_only(name: str, op: Any, compute: Callable[[Any, list, dict], Any]) -> CpuGap:
    """A fused recurrent-cell kernel only CUDA has (the CPU refuses every dtype), and its plain-op form."""
    return CpuGap(
        name,
        (op,),
        FLOAT_DTYPES,
        compute,
        f"Could not run '{op._schema.name}' with arguments from the 'CPU' backend",
        "torch's LSTM and GRU cells call the fused kernel on every accelerator (PrivateUse1 included) and only CUDA "
        "has one; the plain-op form is the cell's definition, backward torch's own differentiable cell formula",
    )


def _matmul_out_dtype(func: Any, cargs: list, ckwargs: dict) -> Any:
    """``mm/bmm/addmm/baddbmm.dtype``: the product of (b)f16 operands accumulated in f32 and returned in
    ``out_dtype``, as the MXU does (bf16 multiplies, f32 accumulation). Widening the operands to f32 is exact,
    so the op's default overload on them is that product."""
    names = [argument.name for argument in func._schema.arguments]
    at = names.index("out_dtype")
    kwargs = dict(ckwargs)
    out_dtype = cargs[at] if len(cargs) > at else kwargs.pop("out_dtype")
    operands = [t.float() if t.is_floating_point() else t for t in cargs[:at]]
    return func.overloadpacket.default(*operands, *cargs[at + 1 :], **kwargs).to(out_dtype)


# The out_dtype matmuls (torch.bmm(a, b, out_dtype=torch.float32)) that this torch has: CUDA kernels only.
_OUT_DTYPE_MATMULS = tuple(
    getattr(aten, name).dtype for name in ("mm", "bmm", "addmm", "baddbmm") if hasattr(getattr(aten, name), "dtype")
)

# torch's shape function of ``_grouped_mm`` (the mixture-of-experts grouped matmul) mirrors the CUDA kernel and refuses
# every dtype but bf16; TorchTPU lowers it for every float dtype (transformers calls it on "tpu" whatever the
# weights' dtype), and the CPU kernel takes f32 too. The op below is the same product under a name whose shape
# function accepts what TorchTPU does, so recording (meta inference) and tracing (fake tensors) keep one node
# that the XLA lowering (:mod:`tpu_agent.runtime.xla.extra_ops`) compiles as a ragged dot.
_LIBRARY = torch.library.Library("tpu_agent", "DEF")
_LIBRARY.define(
    "grouped_mm(Tensor mat_a, Tensor mat_b, Tensor? offs=None, Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor"
)


def _grouped_mm_cpu(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    return aten._grouped_mm(mat_a, mat_b, offs, bias, out_dtype)


def _grouped_mm_shape(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """torch's own shape rules (sizes, groups, offsets), asked of bf16 operands, in the dtype the op returns."""
    shaped = aten._grouped_mm(mat_a.to(torch.bfloat16), mat_b.to(torch.bfloat16), offs, None, None)
    return torch.empty(shaped.shape, dtype=out_dtype or mat_a.dtype, device=mat_a.device)


_LIBRARY.impl("grouped_mm", _grouped_mm_cpu, "CPU")
torch.library.register_fake("tpu_agent::grouped_mm", _grouped_mm_shape, lib=_LIBRARY)


def _grouped_mm_any_float(func: Any, cargs: list, ckwargs: dict) -> Any:
    return torch.ops.tpu_agent.grouped_mm(*cargs, **ckwargs)


GAPS: tuple[CpuGap, ...] = (
    CpuGap(
        name="histc-integer",
        ops=(aten.histc.default,),
        refused_dtypes=INTEGER_DTYPES,
        compute=_upcast_and_back(torch.float64),
        cpu_error="\"histogram_cpu\" not implemented for 'Int'",
        rationale="device kernels count integer inputs (transformers' MoE grouped-matmul path relies on it); "
        "float64 holds every int32 exactly and the counts are integers, so the cast back is exact",
    ),
    CpuGap(
        name="upsample-nearest-integer",
        ops=tuple(getattr(getattr(aten, f"upsample_nearest{n}d"), o) for n in (1, 2, 3) for o in ("default", "vec")),
        refused_dtypes=INTEGER_DTYPES - {torch.uint8},
        compute=_upcast_and_back(torch.float64),
        cpu_error="\"upsample_nearest2d_channels_last\" not implemented for 'Int'",
        rationale="nearest-neighbour resizing only copies values, so a float64 round trip is exact for integers",
    ),
    CpuGap(
        name="matmul-out-dtype",
        ops=_OUT_DTYPE_MATMULS,
        refused_dtypes=FLOAT_DTYPES,
        compute=_matmul_out_dtype,
        cpu_error="Could not run 'aten::bmm.dtype' with arguments from the 'CPU' backend",
        rationale="TorchTPU's precision guide forces a wider output with out_dtype (bf16 inputs, f32 result); torch "
        "has only CUDA kernels for these overloads, and f32 operands give the same f32-accumulated product",
    ),
    CpuGap(
        name="grouped-mm-any-float",
        ops=(aten._grouped_mm.default,),
        refused_dtypes=FLOAT_DTYPES - {torch.bfloat16},
        compute=_grouped_mm_any_float,
        cpu_error="Expected inputs of BF16 type but got mat_a.dtype=torch.float32 (its shape function, on meta "
        "and fake tensors)",
        rationale="TorchTPU lowers the grouped matmul for every float dtype and transformers' MoE layers call it on "
        "tpu whatever the weights' dtype; the CPU kernel computes f32 as it is, and the shape is torch's own",
    ),
    _cuda_only("lstm-cell", aten._thnn_fused_lstm_cell.default, _lstm_cell),
    _cuda_only("lstm-cell-backward", aten._thnn_fused_lstm_cell_backward_impl.default, _lstm_cell_backward),
    _cuda_only("gru-cell", aten._thnn_fused_gru_cell.default, _gru_cell),
    _cuda_only("gru-cell-backward", aten._thnn_fused_gru_cell_backward.default, _gru_cell_backward),
)

BY_OP: dict[Any, CpuGap] = {op: gap for gap in GAPS for op in gap.ops}


def compute(gap: CpuGap | None, func: Any, cargs: list, ckwargs: dict) -> Any:
    """``func`` on CPU (or meta) arguments: the kernel, or the gap's computation when its input is one the kernel
    refuses. Meta inference comes here too: where torch's shape function refuses what the device accepts
    (``_grouped_mm`` on f32), the gap's computation has a shape function that accepts it."""
    first = cargs[0] if cargs else None
    if gap is not None and isinstance(first, torch.Tensor) and first.dtype in gap.refused_dtypes:
        return gap.compute(func, cargs, ckwargs)
    return func(*cargs, **ckwargs)
