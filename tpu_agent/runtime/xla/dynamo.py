"""``torch.compile(backend="tpu")`` through XLA: Dynamo graph -> AOTAutograd (forward and backward ATen
graphs over the tpu tensors' CPU data) -> one :class:`~tpu_agent.runtime.xla.graphs.GraphRunner` each.

AOTAutograd traces through the tpu tensor subclass onto its CPU data (``TpuTensor.__tensor_flatten__``), so the
compiled graphs see plain CPU tensors and their outputs are wrapped back into tpu tensors by AOTAutograd
itself; input mutations it functionalised are written back by its runtime wrappers, through the device.
Torch's core ATen decompositions (and :mod:`.decompositions`' foreach loops) run first: torchax lowers the
decomposed forms of the composite backward ops (``native_layer_norm_backward`` and others) more reliably than
their fused forms.

Forward and backward are split by the min-cut partitioner (as Inductor's training graphs are): the backward
recomputes what is cheaper to recompute than to hand over, such as the transposed weights of every linear layer
and elementwise chains, which XLA fuses into the backward's own kernels. Every tensor the forward saves is an
executable output to write out and an input to read back, so saving fewer makes both calls cheaper (a fifth
fewer on a small Llama).

A graph AOTAutograd cannot trace (other than one Dynamo breaks itself, see :data:`_DYNAMO_HANDLES`) runs op by
op on the device, reported as a :class:`~tpu_agent.runtime.events.FallbackOp`, instead of failing the compile.

A tensor AOTAutograd did not derive from a tpu input (a factory such as ``torch.arange(n, device=x.device)``,
alone in a graph after a break) is a plain tensor to it, so the executable's CPU result would leak out as a CPU
tensor: :func:`_on_devices` puts such outputs back on the device Dynamo recorded for them.

AOTAutograd guesses that the gradient of an input a graph writes into will be a plain tensor of zeros, even for a
tensor subclass. On this device every tensor is the subclass, and a graph that writes into an input and returns it
(``out.add_(bias); return out``: transformers' grouped-MoE linear, resumed after its ``_grouped_mm`` graph break)
then had its whole backward traced over plain tensors and handed the autograd engine CPU gradients for tpu inputs,
which failed where they met the same tensors' tpu gradients (GPT-OSS under compile). :data:`_AOT_CONFIG` turns
that guess off for the device's graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo.exc
import torch._functorch.config as functorch_config
import torch.utils._pytree as pytree

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import tensor
from tpu_agent.runtime.xla import decompositions
from tpu_agent.runtime.xla.graphs import GraphRunner, op_count, report_fallback

_TPU = torch.device("tpu", 0)
# a written input's gradient has the input's type: the device's tensors are all the subclass (see the module doc)
_AOT_CONFIG = {"disable_guess_zero_tangent_for_mutated_input_subclass": True}
# Left to Dynamo: its own control flow (restarts, skips) and the fake-tensor refusals it turns into a graph break
# at the op (a data-dependent output shape, as a boolean-mask index_put's backward has), as it does on CPU
_DYNAMO_HANDLES = (torch._dynamo.exc.TorchDynamoException, *torch._dynamo.exc.exceptions_allowed_to_be_fallback)


def compile_dynamo_graph(
    gm: torch.fx.GraphModule, example_inputs: list[Any], name: str, site: events.Site | None
) -> Callable[..., Any]:
    """The compiled callable for one Dynamo graph: forward and backward run as XLA executables."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
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
        partition_fn=min_cut_rematerialization_partition,
    )
    try:
        with functorch_config.patch(_AOT_CONFIG):
            compiled = backend(gm, example_inputs)
    except _DYNAMO_HANDLES:
        raise
    except Exception as error:  # noqa: BLE001 - a graph AOTAutograd cannot trace runs op by op, never a crash
        report_fallback(f"{name} [xla]", op_count(gm), error, site)
        return gm.forward
    return _on_devices(compiled, _output_devices(gm))


def _output_devices(gm: torch.fx.GraphModule) -> list[torch.device | None]:
    """The device of each output of the Dynamo graph, as Dynamo's example values recorded it."""
    output = next(node for node in reversed(gm.graph.nodes) if node.op == "output")
    devices: list[torch.device | None] = []
    for value in pytree.tree_leaves(output.args[0]):
        example = value.meta.get("example_value", value.meta.get("val")) if isinstance(value, torch.fx.Node) else None
        devices.append(example.device if isinstance(example, torch.Tensor) else None)
    return devices


def _on_devices(compiled: Callable[..., Any], devices: list[torch.device | None]) -> Callable[..., Any]:
    """``compiled`` with every CPU output that Dynamo expected on the tpu device moved there."""
    tpu_positions = [i for i, device in enumerate(devices) if device is not None and device.type == "tpu"]
    if not tpu_positions:
        return compiled

    def run(*args: Any) -> Any:
        outputs = compiled(*args)
        if not isinstance(outputs, (list, tuple)) or len(outputs) != len(devices):
            return outputs
        fixed = list(outputs)
        for i in tpu_positions:
            out = fixed[i]
            if isinstance(out, torch.Tensor) and out.device.type == "cpu":
                fixed[i] = out.to(_TPU) if out.requires_grad else tensor.wrap(out)
        return type(outputs)(fixed) if isinstance(outputs, tuple) else fixed

    return run
