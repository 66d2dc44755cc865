"""Materialisation and waiting, over the emulation's pending DeferAndFuse graph.

TorchTPU's guides call ``synchronize`` at the end of a step so that a profile or a timer sees the step's work
done. In the emulation work is pending only in the deferring eager modes; synchronizing runs the pending graph
(a flush with cause ``synchronize``, which ``tpu-agent profile`` reports) and counts as a host sync. Strict and
Debug Eager have nothing pending, so it returns at once, as on the device once the queue is drained.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.utils import _pytree

from tpu_agent.runtime.emulated import streams
from tpu_agent.runtime.emulated.flush_cause import FlushCause


def synchronize(tensors: torch.Tensor | Iterable[torch.Tensor] | None = None, wait: bool = True) -> None:
    """Run the pending work (the whole pending graph, which holds what the tensors depend on); ``wait=False`` is
    accepted, and the emulation waits either way."""
    streams.synchronize_device(FlushCause.SYNCHRONIZE)


def is_materialized(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds data already (False while it is an output of the pending DeferAndFuse graph)."""
    return isinstance(getattr(tensor, "_elem", None), torch.Tensor)


def computation_mlir(*tensors: torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...]) -> str:
    """The StableHLO text of the computation still pending for the tensors.

    In the deferring eager modes that is the whole pending graph, lowered as ``--compiler xla`` would compile it
    (so ``x + 1`` then ``* 2`` show ``stablehlo.add`` and ``stablehlo.multiply`` in one module); with nothing
    pending (Strict Eager runs each op at once) it is a module that only returns the tensors. Nothing runs.
    """
    from tpu_agent.runtime.xla import settings

    settings.require_xla("torch_tpu._internal.sync.computation_mlir (it lowers the pending graph with JAX)")
    import jax

    from tpu_agent.runtime.xla import executor, lowering

    pending = executor.pending_stablehlo()
    if pending is not None:
        return pending
    leaves = [t for t in _pytree.tree_leaves(tensors) if isinstance(t, torch.Tensor)]
    shapes = [jax.ShapeDtypeStruct(tuple(t.shape), lowering.torch_dtype_to_jax(t.dtype)) for t in leaves]
    return str(jax.jit(lambda *values: values).lower(*shapes).as_text())


GUIDE_PAGE = "deferred_execution"  # the TorchTPU notebook that documents this module (read by tpu_lookup_api)
