"""A graph the XLA compiler runs shows the profiler the same ops, shapes and dtypes as the same graph run op by
op: the profile's shape, precision and alignment rules judge the program, not the compiler that ran it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.profiler import ProfilerActivity, profile

from tpu_agent.profile.kineto import XLA_EXECUTABLE_RECORD, read_ops
from tpu_agent.profile.model import Op
from tpu_agent.profile.op_classes import MATMUL_OPS
from tpu_agent.runtime.emulated.state import Precision
from tpu_agent.runtime.xla.graphs import EagerOps, GraphRunner


def _layer(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias).relu().to(torch.bfloat16)


def _profiled(run: object, tmp_path: Path, name: str) -> list[Op]:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()  # type: ignore[operator]
    trace = tmp_path / f"{name}.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    return read_ops(trace)


def _seen(ops: list[Op]) -> list[tuple[str, list[list[int]], list[str]]]:
    """What the shape and precision rules read of a graph: its matmuls and dtype casts with their inputs."""
    return [(op.name, op.input_shapes, op.input_dtypes) for op in ops if op.name in {*MATMUL_OPS, "aten::_to_copy"}]


def test_xla_graph_shows_the_profiler_its_ops_shapes_and_dtypes(tmp_path: Path) -> None:
    inputs = [torch.randn(96, 256), torch.randn(128, 256), torch.randn(128)]
    graph = make_fx(_layer)(*inputs)
    runner = GraphRunner(graph, "layer")
    runner(*inputs)  # compiled outside the profile, as a warm-up would

    # at full precision, the op-by-op path adds no MXU operand rounding casts of its own
    eager = _seen(_profiled(lambda: EagerOps(graph, Precision.HIGHEST).run(*inputs), tmp_path, "eager"))
    xla_ops = _profiled(lambda: runner(*inputs), tmp_path, "xla")
    assert eager and _seen(xla_ops) == eager
    assert (
        "aten::addmm",
        [[128], [96, 256], [256, 128], [], []],
        ["float", "float", "float", "Scalar", "Scalar"],
    ) in eager

    executable = next(op for op in xla_ops if op.name == XLA_EXECUTABLE_RECORD)
    inside = [op for op in xla_ops if op is not executable and op.thread == executable.thread]
    inside = [op for op in inside if executable.start_ns <= op.start_ns < executable.start_ns + executable.duration_ns]
    assert not executable.costed and all(op.costed for op in inside)
    # the executable's time, laid over its ops end to end, most of it on the matmul
    assert sum(op.duration_ns for op in inside) == executable.duration_ns
    matmul = next(op for op in inside if op.name in MATMUL_OPS)
    assert matmul.duration_ns == max(op.duration_ns for op in inside)
