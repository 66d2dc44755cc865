"""Two ops the capture of mixture-of-experts and CNN training steps met without a lowering, against torch's CPU
kernels: ``convolution_backward`` (grouped, strided and dilated, transposed) and ``_grouped_mm`` (the MoE grouped
matmul, forward and both backward forms), and the emulated device taking f32 grouped matmuls (torch's shape function
accepts bf16 only; TorchTPU lowers every float dtype) through a DeferAndFuse step compiled by XLA."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from runtime_launch_util import run_script

from tpu_agent.runtime.xla import extra_ops, torchax_compat

CONVOLUTIONS = [
    # (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
    ((2, 4, 9, 9), (6, 2, 3, 3), (1, 1), (1, 1), (1, 1), False, (0, 0), 2),  # grouped
    ((2, 3, 11, 10), (5, 3, 3, 2), (2, 3), (0, 1), (2, 1), False, (0, 0), 1),  # strided, dilated
    ((2, 4, 5, 5), (4, 3, 3, 3), (2, 2), (1, 1), (1, 1), True, (1, 1), 2),  # transposed, grouped
    ((2, 3, 12), (4, 3, 5), (2,), (2,), (1,), False, (0,), 1),  # 1-D
]


@pytest.mark.parametrize(
    ("shape", "weight_shape", "stride", "padding", "dilation", "transposed", "output_padding", "groups"),
    CONVOLUTIONS,
)
def test_convolution_backward_lowering_is_torchs(
    shape: tuple[int, ...],
    weight_shape: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    transposed: bool,
    output_padding: tuple[int, ...],
    groups: int,
) -> None:
    torch.manual_seed(0)
    x, weight = torch.randn(shape), torch.randn(weight_shape)
    bias = torch.randn(weight_shape[1] * groups if transposed else weight_shape[0])
    conv = (x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    grad = torch.randn(torch.ops.aten.convolution(*conv).shape)
    config = (stride, padding, dilation, transposed, output_padding, groups)
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        expected = torch.ops.aten.convolution_backward(grad, x, weight, list(bias.shape), *config, mask)
        lowered = jax.jit(
            functools.partial(
                extra_ops.convolution_backward,
                torchax_compat.load().ops.jaten._aten_convolution,
                bias_sizes=list(bias.shape),
                stride=stride,
                padding=padding,
                dilation=dilation,
                transposed=transposed,
                output_padding=output_padding,
                groups=groups,
                output_mask=mask,
            )
        )(jnp.asarray(grad.numpy()), jnp.asarray(x.numpy()), jnp.asarray(weight.numpy()))
        for want, got in zip(expected, lowered, strict=True):
            assert (want is None) == (got is None), mask
            if want is not None:
                np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-4)


OFFSETS = torch.tensor([3, 3, 8, 16], dtype=torch.int32)  # an empty group, and groups of 3, 5 and 8


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "offs"),
    [
        ((16, 8), (4, 8, 8), OFFSETS),  # the forward: tokens sorted by expert, one weight per expert
        ((8, 16), (16, 8), OFFSETS),  # the weight gradient: contracted over each expert's tokens
        ((4, 8, 8), (4, 8, 8), None),  # batched
    ],
)
def test_grouped_mm_lowering_is_torchs(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], offs: torch.Tensor | None
) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    expected = torch._grouped_mm(a, b, offs=offs)
    lowered = extra_ops.grouped_mm(
        jnp.asarray(a.numpy()), jnp.asarray(b.numpy()), None if offs is None else jnp.asarray(offs.numpy())
    )
    np.testing.assert_allclose(np.asarray(lowered), expected.numpy(), rtol=1e-5, atol=1e-5)


SCRIPT = r"""
import json, torch
from tpu_agent.runtime.api import activate
activate()
torch.set_float32_matmul_precision("highest")
torch.manual_seed(0)
offs = torch.tensor([3, 3, 8, 16], dtype=torch.int32)
tokens, weights, mix = torch.randn(16, 8), torch.randn(4, 8, 8), torch.randn(16, 8)
def step(device):
    a = tokens.to(device, copy=True).requires_grad_()
    b = weights.to(device, copy=True).requires_grad_()
    out = torch._grouped_mm(a, b, offs=offs.to(device))  # f32: torch's shape function takes bf16 only
    (out * mix.to(device)).sum().backward()
    return [t.cpu() for t in (out, a.grad, b.grad)]
expected = [torch.cat([tokens[s:e] @ weights[g] for g, (s, e) in enumerate(zip([0, 3, 3, 8], offs.tolist()))])]
expected += step("cpu")[1:]
from tpu_agent.runtime.xla import cache
got = step("tpu")
print(json.dumps({"max_error": max((x - y).abs().max().item() for x, y in zip(got, expected)),
                  "dtype": str(got[0].dtype), "compiles": cache.executables.stats.compiles}))
"""


@pytest.mark.slow  # a subprocess that compiles through XLA
def test_an_f32_grouped_matmul_trains_on_tpu_through_xla(tmp_path: Path) -> None:
    out = run_script(SCRIPT, tmp_path, TPU_AGENT_COMPILER="xla", TORCH_TPU_DEFER_AND_FUSE="1")
    assert out["compiles"] >= 1, out  # the step went through XLA, grouped matmuls and all
    assert out["dtype"] == "torch.float32", out
    assert out["max_error"] < 1e-4, out


def test_torchs_shape_function_refuses_f32_grouped_mm_and_the_gap_record_gives_its_shape() -> None:
    from tpu_agent.runtime.emulated import cpu_gaps

    op = torch.ops.aten._grouped_mm.default
    a, b = torch.empty(16, 8, device="meta"), torch.empty(4, 8, 8, device="meta")
    offs = torch.empty(4, dtype=torch.int32, device="meta")
    with pytest.raises(RuntimeError, match="BF16"):
        op(a, b, offs=offs)  # the record is needed while torch's shape function mirrors the CUDA kernel
    out = cpu_gaps.compute(cpu_gaps.BY_OP[op], op, [a, b], {"offs": offs})
    assert out.is_meta and out.shape == (16, 8) and out.dtype == torch.float32
