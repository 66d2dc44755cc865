"""``torch.compile(backend="tpu")`` through XLA: Dynamo graph -> AOTAutograd (forward and backward ATen
graphs over the tpu tensors' CPU data) -> one :class:`~tpu_agent.runtime.xla.graphs.GraphRunner` each.

AOTAutograd traces through the tpu tensor subclass onto its CPU data (``TpuTensor.__tensor_flatten__``), so the
compiled graphs see plain CPU tensors and their outputs are wrapped back into tpu tensors by AOTAutograd
itself; input mutations it functionalised are written back by its runtime wrappers, through the device.
Torch's core ATen decompositions (and :mod:`.decompositions`' foreach loops) run first: torchax lowers the
decomposed forms of the composite backward ops (``native_layer_norm_backward`` and others) more reliably than
their fused forms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tpu_agent.runtime import events
from tpu_agent.runtime.xla import decompositions
from tpu_agent.runtime.xla.graphs import GraphRunner


def compile_dynamo_graph(
    gm: torch.fx.GraphModule, example_inputs: list[Any], name: str, site: events.Site | None
) -> Callable[..., Any]:
    """The compiled callable for one Dynamo graph: forward and backward run as XLA executables."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind: str) -> Callable[..., Any]:
        def compile_part(part: torch.fx.GraphModule, _inputs: list[Any]) -> Callable[..., Any]:
            runner = GraphRunner(part, f"{name} [xla {kind}]", site)
            return make_boxed_func(runner)

        return compile_part

    backend = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decompositions.table(),
    )
    return backend(gm, example_inputs)
