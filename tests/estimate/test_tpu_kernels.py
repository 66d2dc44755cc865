"""TorchTPU's attention in the estimate: SDPA's fused op compiled as a blockwise flash kernel, memory linear in
the sequence, the math form's FLOPs, the same numbers as the CPU lowering."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from tpu_compiler import needs_tpu_compiler

from tpu_agent.chips import parse_target
from tpu_agent.estimate.capture import ObservedGraph, step_program
from tpu_agent.estimate.captured import CapturedGraph
from tpu_agent.estimate.model import ArgRole
from tpu_agent.estimate.step import estimate_step
from tpu_agent.runtime.emulated.state import Precision
from tpu_agent.runtime.xla import extra_ops, tpu_kernels

aten = torch.ops.aten


@pytest.mark.parametrize(
    ("is_causal", "mask_shape"),
    [(True, None), (False, "full"), (False, "padding")],  # padding: a (B, 1, 1, S) key mask, broadcast over rows
)
def test_the_blockwise_kernel_computes_what_the_cpu_lowering_computes(is_causal: bool, mask_shape: str | None) -> None:
    rng = np.random.default_rng(0)
    batch, heads, kv_heads, length, width = 2, 4, 2, 64, 8  # grouped-query attention, four tiles a side

    def draw(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    query, key, value = (
        draw(batch, heads, length, width),
        draw(batch, kv_heads, length, width),
        draw(batch, kv_heads, length, width),
    )
    rows = {"full": length, "padding": 1}.get(mask_shape or "")
    mask = draw(batch, 1, rows, length) if rows else None
    out, lse = extra_ops.flash_attention(query, key, value, 0.0, is_causal, attn_mask=mask)
    tiled_out, tiled_lse = tpu_kernels.flash_attention(query, key, value, is_causal, mask, None, block=16)
    np.testing.assert_allclose(tiled_out, out, atol=1e-5)
    np.testing.assert_allclose(tiled_lse, lse, atol=1e-5)
    grad = draw(*out.shape)
    expected = extra_ops.flash_attention_backward(grad, query, key, value, out, lse, 0.0, is_causal, attn_mask=mask)
    tiled = tpu_kernels.flash_attention_backward(grad, query, key, value, out, lse, is_causal, mask, None, block=16)
    for got, want in zip(tiled, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def _attention_step(length: int, heads: int = 4, kv_heads: int = 2, width: int = 128) -> ObservedGraph:
    """SDPA forward and backward as the emulated device records them (the CPU's fused flash op pair), traced
    to an ATen graph on meta tensors: the graph the estimate compiles for a causal GQA attention layer."""

    def step(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, grad: torch.Tensor) -> tuple:
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, True)
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, query, key, value, out, lse, 0.0, True)
        return out, *grads

    shapes = [(1, heads, length, width), (1, kv_heads, length, width), (1, kv_heads, length, width)]
    shapes.append(shapes[0])
    examples = [torch.empty(shape, dtype=torch.bfloat16, device="meta") for shape in shapes]
    gm = torch.fx.experimental.proxy_tensor.make_fx(step)(*examples)
    inputs: list = [(shape, torch.bfloat16, None) for shape in shapes]
    return ObservedGraph(CapturedGraph.of(gm, "attention"), Precision.DEFAULT, inputs)


@needs_tpu_compiler
@pytest.mark.slow
def test_attention_compiles_memory_linear_in_the_sequence_with_the_math_forms_flops() -> None:
    target = parse_target("v6e")
    programs = {}
    for length in (1024, 2048):
        program = step_program(_attention_step(length), 0, lambda storage: ArgRole.BATCH)
        programs[length] = estimate_step([program], target).programs[0]
    short, long = programs[1024], programs[2048]
    # the math form's (L, S) scores alone are 4 x 2048 x 2048 x 4 bytes = 64 MiB at 2048 and 4x that per doubling
    assert long.memory.temporaries < 2.2 * short.memory.temporaries
    assert long.memory.temporaries < 4 * 2048 * 2048 * 4
    for length, program in programs.items():
        # forward QK^T and PV, backward QK^T again, dV, dP, dQ, dK: 7 matmuls of 2 x H x L x S x E each, causal
        # or not (the math form's count; see tpu_kernels)
        assert program.flops == pytest.approx(7 * 2 * 4 * length * length * 128, rel=0.05)
        assert program.kernels == [tpu_kernels.FLASH_ATTENTION]
