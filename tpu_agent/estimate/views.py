"""Inputs that a graph reads only through views of a packed buffer, given one input per view.

A DeferAndFuse graph reaches every input as its storage buffer and reads tensors as strided views of it. Some
storages pack many tensors: FSDP2 makes each layer's sharded gradients views into one flat reduce-scatter
output. Sharded for the slice as one flat array, the buffer's chip boundaries fall inside the tensors, so
the TPU compiler moves data between chips to line them up: a 7B Llama's AdamW update came out with 1,800
collective-permutes (16 GB) and 32 all-gathers, none of which the update does on a slice (each rank updates
its own shards), and took six minutes to compile. On the slice each rank's shard of each tensor is its own;
so here each view the graph reads becomes an input of its own, shaped as the view and sharded as any tensor.

Only buffers read through dense, contiguous, disjoint views and never written are unpacked: a buffer the
graph writes keeps its single input (the write-back is a copy of the whole storage).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch._prims_common import make_contiguous_strides_for

_READ = torch.ops.aten.as_strided_copy.default  # a functional graph's read of a view (a copy: never written)

Described = tuple[tuple[int, ...], torch.dtype, int | None] | float  # an input as a capture records it


def _view(node: torch.fx.Node) -> tuple[tuple[int, ...], int] | None:
    """``(sizes, storage offset)`` of a read of its first argument as a contiguous block; None otherwise."""
    if node.target is not _READ or node.kwargs or len(node.args) < 3:
        return None
    sizes, strides = [int(s) for s in node.args[1]], [int(s) for s in node.args[2]]
    offset = int(node.args[3]) if len(node.args) > 3 and node.args[3] is not None else 0
    if any(s == 0 for s in sizes) or [st for sz, st in zip(sizes, strides, strict=True) if sz != 1] != [
        st for sz, st in zip(sizes, make_contiguous_strides_for(sizes), strict=True) if sz != 1
    ]:
        return None
    return tuple(sizes), offset


def _unpackable(placeholder: torch.fx.Node, described: Described) -> list[tuple[tuple[int, ...], int]] | None:
    """The distinct views of a packed buffer the graph only reads through them, in offset order; None when the
    buffer is read otherwise, written, or not packed (one view of all of it)."""
    if not isinstance(described, tuple) or len(described[0]) != 1:
        return None
    views = set()
    for user in placeholder.users:
        view = _view(user) if user.args and user.args[0] is placeholder else None
        if view is None:
            return None
        views.add(view)
    ordered = sorted(views, key=lambda view: view[1])
    end = 0
    for sizes, offset in ordered:
        if offset < end:
            return None  # overlapping views: one input each would count their shared bytes twice
        end = offset + math.prod(sizes)
    if end > described[0][0] or (len(ordered) == 1 and math.prod(ordered[0][0]) == described[0][0]):
        return None
    return ordered


def unpacked(gm: torch.fx.GraphModule, inputs: Sequence[Described]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """``gm`` with every packed read-only buffer replaced by one input per view, and its inputs described anew
    (a view keeps its buffer's dtype and storage, so it keeps the buffer's role). ``gm`` itself is unchanged."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    plans = {index: _unpackable(node, inputs[index]) for index, node in enumerate(placeholders)}
    if not any(plans.values()):
        return gm, list(inputs)
    graph = copy.deepcopy(gm.graph)
    new_inputs: list[Any] = []
    for index, node in enumerate(node for node in graph.nodes if node.op == "placeholder"):
        views = plans[index]
        described = inputs[index]
        if not views or not isinstance(described, tuple):
            new_inputs.append(described)
            continue
        replacements: dict[tuple[tuple[int, ...], int], torch.fx.Node] = {}
        with graph.inserting_before(node):
            for position, view in enumerate(views):
                replacements[view] = graph.placeholder(f"{node.name}_view{position}")
                new_inputs.append((view[0], described[1], described[2]))
        for user in list(node.users):
            read = _view(user)
            assert read is not None  # every user was checked by _unpackable
            user.replace_all_uses_with(replacements[read])
            graph.erase_node(user)
        graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph), new_inputs
