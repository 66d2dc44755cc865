"""Planning a captured DeferAndFuse graph for XLA: its inputs, its outputs and its cache key (:func:`plan`).

The recorded graph is imperative: in-place ops write into tensors that existed before it (parameters,
optimizer state, ``total += x``), views share storage with their bases, and materialised inputs can be views of
one another (``w`` and ``w.t()``). XLA programs are pure. So a plan makes the graph's inputs the storages it
reads (every tpu tensor it did not produce, and host tensors it captured), each passed once as a flat buffer
from which the replay cuts every view it uses (:class:`Slot`). Its outputs are the produced tensors the program
can still read (:mod:`tpu_agent.runtime.emulated.liveness`). Its key is the graph's structure with the Python
floats left out (they become inputs: :mod:`.tracing`), so a steady training loop finds its executable again.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tpu_agent.runtime.emulated import liveness, state
from tpu_agent.runtime.emulated import tensor as tt
from tpu_agent.runtime.emulated.deferred import Graph


class NotPlannable(Exception):
    """The graph uses something the XLA plan cannot express; the CPU executor runs it."""


@dataclass
class Slot:
    """Where an argument of the replay comes from: input buffer ``buffer`` viewed with this layout."""

    buffer: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass
class Plan:
    """A graph made replayable: flat input buffers, where each tpu tensor read comes from, the key."""

    buffers: list[torch.Tensor]  # one flat CPU tensor per distinct storage read
    slots: dict[int, Slot]  # id(tpu tensor or host tensor) -> its view of a buffer
    outputs: list[Any]  # produced tpu tensors that are not views: filled with results
    floats: list[float]  # the Python float arguments of the nodes, in order (left out of the key)
    key: str
    views: list[Any] = field(default_factory=list)  # the view nodes, in graph order (their outputs alias bases)
    live: set[int] | None = None  # ids of the produced tensors given data (None: all of them)


def _storage_buffer(elem: torch.Tensor) -> torch.Tensor:
    """The whole storage behind ``elem`` as a flat tensor of its dtype (the replay cuts views from it)."""
    storage = elem.untyped_storage()
    numel = storage.nbytes() // elem.element_size()
    return torch.empty(0, dtype=elem.dtype).set_(storage, 0, (numel,), (1,))


_TENSOR_TYPES = (tt.TpuTensor, torch.Tensor, torch.nn.Parameter)


class Planner:
    """One pass over the nodes: numbers every tensor, registers the inputs' storages, writes the key."""

    def __init__(self, live: set[int] | None = None) -> None:
        # ids of the produced tensors the program can still read (liveness.live_results); None: all of them
        self.live = live
        self.buffers: list[torch.Tensor] = []
        self.by_storage: dict[int, int] = {}
        self.slots: dict[int, Slot] = {}
        self.numbering: dict[int, int] = {}
        self.outputs: list[Any] = []
        self.floats: list[float] = []
        self.parts: list[str] = []

    def read(self, value: Any) -> str:
        """The key text for an argument; a tensor not produced by the graph becomes an input."""
        kind = type(value)
        if kind is int:  # sizes and dims: the most frequent argument, so tested first
            return str(value)
        if kind is tt.TpuTensor or kind in _TENSOR_TYPES or isinstance(value, torch.Tensor):
            number = self.numbering.get(id(value))
            return f"#{number if number is not None else self._input(value)}"
        if kind is list or kind is tuple:  # a foreach op's lists: tensors and ints read inline (no call each)
            numbering, items = self.numbering, []
            for v in value:
                item_kind = type(v)
                if item_kind is int:
                    items.append(str(v))
                elif item_kind is tt.TpuTensor:
                    number = numbering.get(id(v))
                    items.append(f"#{number if number is not None else self._input(v)}")
                else:
                    items.append(self.read(v))
            return "[" + ",".join(items) + "]"
        if kind is float:
            self.floats.append(value)
            # zero and non-finite floats are often structural (dropout_p=0.0): never lifted, so keyed by value
            return "f" if value and math.isfinite(value) else f"f={value!r}"
        if kind is torch.device:
            return "dev"
        return repr(value)

    def _input(self, t: Any) -> int:
        elem = t._elem if type(t) is tt.TpuTensor else t
        if elem is None or type(elem) is not torch.Tensor:
            raise NotPlannable("a tensor without data (its producing flush failed)")
        storage = elem.untyped_storage().data_ptr()
        index = self.by_storage.get(storage)
        if index is None:
            index = self.by_storage[storage] = len(self.buffers)
            self.buffers.append(_storage_buffer(elem))
            self.parts.append(f"B{index}:{elem.dtype}:{self.buffers[index].numel()}")
        elif self.buffers[index].dtype != elem.dtype:
            raise NotPlannable("one storage viewed with two dtypes")
        slot = self.slots[id(t)] = Slot(index, tuple(elem.shape), elem.stride(), elem.storage_offset())
        number = self.numbering[id(t)] = len(self.numbering)
        self.parts.append(f"#{number}=B{index}{slot.shape}{slot.stride}+{slot.offset}")
        return number

    def produce(self, value: Any, is_view: bool) -> str:
        """The key text for a node's outputs; tensors first seen here are the graph's results."""
        kind = type(value)
        if kind is list or kind is tuple:
            return "[" + ",".join([self.produce(v, is_view) for v in value]) + "]"
        if not isinstance(value, torch.Tensor):
            return repr(value)
        number = self.numbering.get(id(value))
        if number is None:
            number = self.numbering[id(value)] = len(self.numbering)
            if self.live is not None and id(value) not in self.live:
                return f"#{number}~"  # dead once the graph is done: XLA need not write it out
            if not is_view:
                self.outputs.append(value)
        return f"#{number}"


_PRECISION = {p: p.name for p in state.Precision}  # Enum.name is a Python property: looked up once


def plan(graph: Graph, planner: Planner | None = None) -> Plan:
    """Inputs, output tensors and a structural cache key for ``graph`` (raises :class:`NotPlannable`).

    Only the produced tensors the program can still read are outputs (:func:`liveness.live_results`); which
    ones those are is part of the key, so a step that keeps another tensor compiles an executable that returns it.
    A ``planner`` given by the caller (the capture-only estimate's, whose inputs hold no data) is used as it is."""
    if planner is None:
        planner = Planner(liveness.live_results(graph))
    parts = planner.parts
    views = []
    read, produce = planner.read, planner.produce
    for node in graph.nodes:
        args = read(node.args)
        kwargs = read(list(node.kwargs.items())) if node.kwargs else ""
        is_view = node.func.is_view
        if is_view:
            views.append(node)
        # the signature names the op (recording made it: no OpOverload.__str__ here)
        parts.append(f"{node.signature}{args}{kwargs}->{produce(node.outputs, is_view)}@{_PRECISION[node.precision]}")
    key = hashlib.sha1("\n".join(parts).encode()).hexdigest()[:20]
    return Plan(planner.buffers, planner.slots, planner.outputs, planner.floats, key, views, planner.live)
