"""Max pooling's backward through XLA: the lowering against torch's CPU kernel, and a pooling network's gradients
through a DeferAndFuse step compiled by XLA against plain CPU. torchax's own rule added each gradient over the
whole window at the wrong dims, one scatter per output (BiT's backward never finished compiling)."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from runtime_launch_util import run_script

from tpu_agent.runtime.xla import extra_ops

POOLS = [
    # (input shape, kernel, stride, padding, dilation, ceil_mode): overlapping windows (3/2: elements chosen twice),
    # padding, dilation, ceil mode's partial windows, an unbatched input, and 3-D pooling
    ((2, 3, 9, 11), (3, 3), (2, 2), (1, 1), (1, 1), False),
    ((2, 3, 10, 10), (2, 3), (2, 1), (0, 1), (2, 1), True),
    ((4, 7, 7), (3, 3), (1, 1), (1, 1), (1, 1), False),
    ((1, 2, 5, 6, 7), (3, 2, 3), (2, 2, 2), (1, 0, 1), (1, 1, 1), True),
]


@pytest.mark.parametrize(("shape", "kernel", "stride", "padding", "dilation", "ceil_mode"), POOLS)
def test_max_pool_backward_lowering_is_torchs(
    shape: tuple[int, ...],
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    ceil_mode: bool,
) -> None:
    torch.manual_seed(0)
    x = torch.randint(-4, 4, shape).float()  # small integers: ties, so overlapping windows pick one element often
    spatial = len(kernel)
    forward = torch.ops.aten.max_pool2d_with_indices if spatial == 2 else torch.ops.aten.max_pool3d_with_indices
    backward = (
        torch.ops.aten.max_pool2d_with_indices_backward
        if spatial == 2
        else torch.ops.aten.max_pool3d_with_indices_backward
    )
    _, indices = forward(x, kernel, stride, padding, dilation, ceil_mode)
    grad = torch.randn(indices.shape)
    expected = backward(grad, x, kernel, stride, padding, dilation, ceil_mode, indices)
    lowered = jax.jit(
        functools.partial(
            extra_ops.max_pool_backward,
            spatial,
            kernel_size=kernel,
            stride=stride,
            padding=padding,
            dilation=dilation,
            ceil_mode=ceil_mode,
        )
    )(jnp.asarray(grad.numpy()), jnp.asarray(x.numpy()), indices=jnp.asarray(indices.numpy()))
    np.testing.assert_allclose(np.asarray(lowered), expected.numpy(), rtol=1e-6, atol=1e-6)


SCRIPT = r"""
import json, torch
from tpu_agent.runtime.api import activate
activate()
torch.set_float32_matmul_precision("highest")
torch.manual_seed(0)
net = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.MaxPool2d(3, 2, 1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3),
    torch.nn.MaxPool2d(2, ceil_mode=True), torch.nn.Flatten(), torch.nn.LazyLinear(5),
)
x = torch.randn(2, 3, 16, 16)
net(x)  # the lazy layer takes its shape
reference = {name: None for name, _ in net.named_parameters()}
net(x).square().sum().backward()
reference = {name: p.grad.clone() for name, p in net.named_parameters()}
net.zero_grad(set_to_none=True)
net.to("tpu")
from tpu_agent.runtime.xla import cache
for step in range(2):  # the second step runs the cached executable
    net.zero_grad(set_to_none=True)
    net(x.to("tpu")).square().sum().backward()
    errors = [(p.grad.cpu() - reference[name]).abs().max().item() for name, p in net.named_parameters()]
print(json.dumps({"max_error": max(errors), "compiles": cache.executables.stats.compiles}))
"""


@pytest.mark.slow
def test_a_pooling_network_trains_through_xla_with_cpus_gradients(tmp_path: Path) -> None:
    out = run_script(SCRIPT, tmp_path, TPU_AGENT_COMPILER="xla", TORCH_TPU_DEFER_AND_FUSE="1")
    assert out["compiles"] >= 1, out  # the step really went through XLA
    assert out["max_error"] < 1e-5, out
