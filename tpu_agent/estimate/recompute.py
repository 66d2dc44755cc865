"""Activation checkpointing as a TPU runs it: the recomputation in the backward stays a recomputation.

``torch.utils.checkpoint`` (reentrant or not; HF's ``gradient_checkpointing_enable()``, FSDP2's composable
``checkpoint`` and ``checkpoint_wrapper`` all go through it) drops a layer's activations in the forward and runs
the layer again in the backward from its saved inputs. Captured into one program with the forward, those
recomputed ops are the forward's ops on the same values, and XLA merges them with the forward's
(common-subexpression elimination): the estimate then showed the memory of a step without checkpointing and
none of the recomputation's FLOPs. While the capture runs, :func:`install` passes the recomputation's inputs
through :mod:`tpu_agent.runtime.xla.barrier`'s optimisation barrier first, as JAX's ``remat`` does, so the
compiled step recomputes what the script recomputes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils.checkpoint as checkpoint

from tpu_agent.runtime.xla import barrier


def behind_barrier(values: tuple[Any, ...] | list[Any]) -> list[Any]:
    """``values`` with every device tensor replaced by its copy behind one optimisation barrier (detached, with
    the ``requires_grad`` of the tensor it stands for, so the recomputation saves what the forward saved)."""
    positions = [
        index
        for index, value in enumerate(values)
        if isinstance(value, torch.Tensor) and value.device.type not in ("cpu", "meta")
    ]
    result = list(values)
    if not positions:
        return result
    with torch.no_grad():
        copies = barrier.optimization_barrier([values[index].detach() for index in positions])
    for index, copy in zip(positions, copies, strict=True):
        copy.requires_grad_(values[index].requires_grad)
        result[index] = copy
    return result


def install() -> Callable[[], None]:
    """Put the barrier before each recomputation of ``torch.utils.checkpoint``; the returned function undoes it.

    Non-reentrant checkpointing recomputes from :meth:`_CheckpointFrame.get_inputs` (called only there);
    reentrant checkpointing from ``detach_variable`` in its backward (the module's only caller of it), whose
    detached leaves the barrier's copies replace."""
    frame = checkpoint._CheckpointFrame
    original_inputs = frame.get_inputs
    original_detach = checkpoint.detach_variable

    def get_inputs(self: Any) -> list[Any]:
        return behind_barrier(original_inputs(self))

    def detach_variable(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(behind_barrier(original_detach(inputs)))

    frame.get_inputs = get_inputs
    checkpoint.detach_variable = detach_variable

    def undo() -> None:
        frame.get_inputs = original_inputs
        checkpoint.detach_variable = original_detach

    return undo


def assumption(graphs: Sequence[tuple[torch.fx.GraphModule, int]]) -> str | None:
    """The estimate's line on checkpointing when the step's graphs (each with its runs per step) recompute
    anything (one barrier per recomputed checkpoint region), else None."""
    count = sum(calls for graph, calls in graphs for node in graph.graph.nodes if node.target is barrier.OP)
    if not count:
        return None
    return (
        f"activation checkpointing: {count} recomputation(s) per step (torch.utils.checkpoint), compiled behind an "
        "optimization barrier as JAX's remat is, so XLA cannot merge them with the forward: their FLOPs and time "
        "are in the step, and the activations they recompute are not kept from the forward"
    )
