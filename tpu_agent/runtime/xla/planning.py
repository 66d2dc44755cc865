"""Planning a captured DeferAndFuse graph for XLA: its inputs, its outputs and its cache key (:func:`plan`).

The recorded graph is imperative: in-place ops write into tensors that existed before it (parameters,
optimizer state, ``total += x``), views share storage with their bases, and materialised inputs can be views of
one another (``w`` and ``w.t()``). XLA programs are pure. So a plan makes the graph's inputs the storages it
reads (every tpu tensor it did not produce, and host tensors it captured), each passed once as a flat buffer
from which the replay cuts every view it uses (:class:`Slot`). A buffer is only the window of its storage that
the graph's inputs span, and the views are cut at offsets within the window: a batch sliced from a dataset
tensor (``data[i:i + bptt]``, a new offset every step) is then the same program input at every step, instead of
a new executable per batch over the whole dataset. Its outputs are the produced tensors the program
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
from tpu_agent.runtime.xla import arrays, extra_ops

# Views that change values, not layout: torch keeps ``z.conj()`` (the backward of every complex multiply: complex
# RoPE's) and ``_neg_view`` as a bit on a tensor over the same storage, which a replay cutting views from the
# storage would read unconjugated. Such a graph runs on the CPU executor (the gradients of Llama 4's complex
# rotary embedding came out wrong by their own size through XLA before).
_MATH_BIT_VIEWS = frozenset({torch.ops.aten._conj.default, torch.ops.aten._neg_view.default})


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
    slots: dict[int, Slot] | None  # id(tpu tensor or host tensor) -> its view of a buffer (None: see complete)
    outputs: list[Any]  # produced tpu tensors that are not views: filled with results
    floats: list[float]  # the Python float arguments of the nodes, in order (left out of the key)
    key: str
    views: list[Any] = field(default_factory=list)  # the view nodes, in graph order (their outputs alias bases)
    live: set[int] | None = None  # ids of the produced tensors given data (None: all of them)


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
        self.parts: list[str | tuple[int, Slot]] = []  # key text; inputs' slots are keyed by finish()

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
        if elem.is_conj() or elem.is_neg():
            raise NotPlannable("a conjugate or negative view, whose values its storage does not hold")
        index = self._buffer_index(elem)
        slot = self.slots[id(t)] = Slot(index, tuple(elem.shape), elem.stride(), elem.storage_offset())
        number = self.numbering[id(t)] = len(self.numbering)
        self.parts.append((number, slot))
        return number

    def _buffer_index(self, elem: torch.Tensor) -> int:
        """The input buffer that holds ``elem``'s storage, registered (and named in the key) when first read."""
        storage = elem.untyped_storage().data_ptr()
        index = self.by_storage.get(storage)
        if index is None:
            index = self.by_storage[storage] = len(self.buffers)
            self.buffers.append(arrays.buffer(elem))
            self.parts.append(f"B{index}:{elem.dtype}")
        elif self.buffers[index].dtype != elem.dtype:
            raise NotPlannable("one storage viewed with two dtypes")
        return index

    def finish(self) -> str:
        """Cut each buffer to the window of its storage that the inputs span, make the slots' offsets relative
        to it, and return the key text (which names window sizes and relative offsets only)."""
        slots = list(self.slots.values())
        windows = _storage_windows(len(self.buffers), [(s.buffer, s.shape, s.stride, s.offset) for s in slots])
        for index, (low, high) in enumerate(windows):
            self.cut(index, low, high)
        for slot in slots:
            slot.offset -= windows[slot.buffer][0]
        text = [part if isinstance(part, str) else _slot_text(*part) for part in self.parts]
        text += [f"W{index}:{high - low}" for index, (low, high) in enumerate(windows)]
        return "\n".join(text)

    def cut(self, index: int, low: int, high: int) -> None:
        """Make input buffer ``index`` its elements ``low:high``."""
        self.buffers[index] = window(self.buffers[index], low, high)

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
    A graph shaped like one planned before (a steady training loop's step: see :func:`_fingerprint`) takes that
    plan's key and positions instead of being planned again; its plan has no slots (:func:`complete` adds them).
    A ``planner`` given by the caller (the capture-only estimate's, whose inputs hold no data) is used as it is."""
    if planner is not None:
        return _plan(graph, planner)
    walk = liveness.Walk(graph)
    live = liveness.live_results(graph, walk)
    found = _fingerprint(walk, live)
    if found is not None:
        entry = _recalled.get(found[0])
        if entry is not None:
            return _recall(graph, walk, live, entry, found[1])
    graph_plan = _plan(graph, Planner(live))
    if found is not None:
        _remember(graph, walk, found[0], graph_plan)
    return graph_plan


def complete(graph: Graph, graph_plan: Plan) -> Plan:
    """``graph_plan`` with its slots (what tracing the graph reads), planning again if it was recalled."""
    return graph_plan if graph_plan.slots is not None else _plan(graph, Planner(graph_plan.live))


def _plan(graph: Graph, planner: Planner) -> Plan:
    parts = planner.parts
    views = []
    read, produce = planner.read, planner.produce
    for node in graph.nodes:
        if node.func is _AS_STRIDED and not extra_ops.reads_logical_order(node.args[0], node.args, node.kwargs):
            raise NotPlannable(f"as_strided on a view of a larger or reordered storage, recorded at {node.site}")
        if node.func in _MATH_BIT_VIEWS:
            raise NotPlannable(f"{node.func} (a view its storage does not hold), recorded at {node.site}")
        args = read(node.args)
        kwargs = read(list(node.kwargs.items())) if node.kwargs else ""
        is_view = node.func.is_view
        if is_view:
            views.append(node)
        # the signature names the op (recording made it: no OpOverload.__str__ here)
        parts.append(f"{node.signature}{args}{kwargs}->{produce(node.outputs, is_view)}@{_PRECISION[node.precision]}")
    key = hashlib.sha1(planner.finish().encode()).hexdigest()[:20]
    return Plan(planner.buffers, planner.slots, planner.outputs, planner.floats, key, views, planner.live)


_AS_STRIDED = torch.ops.aten.as_strided.default


def _slot_text(number: int, slot: Slot) -> str:
    return f"#{number}=B{slot.buffer}{slot.shape}{slot.stride}+{slot.offset}"


def _storage_windows(
    count: int, layouts: list[tuple[int, tuple[int, ...], tuple[int, ...], int]]
) -> list[tuple[int, int]]:
    """For each of ``count`` storages, the element range ``(low, high)`` its tensors span; ``layouts``: each
    tensor's storage index, shape, strides and offset (every storage has at least one)."""
    spans: list[tuple[int, int] | None] = [None] * count
    for index, shape, stride, offset in layouts:
        end = arrays.storage_end(shape, stride, offset)
        span = spans[index]
        spans[index] = (offset, end) if span is None else (min(span[0], offset), max(span[1], end))
    return [span if span is not None else (0, 0) for span in spans]


def window(flat: torch.Tensor, low: int, high: int) -> torch.Tensor:
    """Elements ``low:high`` of a flat buffer: the buffer itself when that is all of it (a parameter's storage:
    the same object at every flush, so its JAX array is kept, :func:`arrays.array`)."""
    return flat if low == 0 and high == flat.numel() else flat[low:high]


def _fingerprint(walk: liveness.Walk, live: set[int]) -> tuple[tuple, list[tuple[torch.Tensor, int, int]]] | None:
    """What a graph's :class:`Planner` key is a function of, and for each storage read the data of its first
    input and the window the inputs span; ``None`` when a node has no shape cache entry or an input no data (then
    the planner plans it, or says why it cannot). The fingerprint is the walk's structure, the storages read
    (each one's dtype and window size, in order of first use, as the planner registers them) and each input's
    view of its window, which results are live, and the floats the key keeps by value (zero and non-finite
    ones)."""
    if walk.fingerprint is None:
        return None
    layouts: list[tuple[int, tuple[int, ...], tuple[int, ...], int]] = []
    dtypes: list[torch.dtype] = []
    by_storage: dict[int, int] = {}
    firsts: list[torch.Tensor] = []
    for t in walk.inputs:
        elem = t._elem if type(t) is tt.TpuTensor else t
        if elem is None or type(elem) is not torch.Tensor:
            return None
        storage = elem.untyped_storage().data_ptr()
        index = by_storage.get(storage)
        if index is None:
            index = by_storage[storage] = len(firsts)
            firsts.append(elem)
        layouts.append((index, elem.shape, elem.stride(), elem.storage_offset()))
        dtypes.append(elem.dtype)
    windows = _storage_windows(len(firsts), layouts)
    items: list[Any] = [(elem.dtype, high - low) for elem, (low, high) in zip(firsts, windows, strict=True)]
    items += [
        (index, dtype, shape, stride, offset - windows[index][0])
        for (index, shape, stride, offset), dtype in zip(layouts, dtypes, strict=True)
    ]
    seen = walk.seen
    items += [id(seen[number]) in live for number in walk.produced]
    items += [repr(v) for v in walk.floats if not (v and math.isfinite(v))]
    return (walk.fingerprint, tuple(items)), [(elem, *span) for elem, span in zip(firsts, windows, strict=True)]


@dataclass
class _Recalled:
    """A planned graph's key, and its outputs and views by position, for the graphs with its fingerprint."""

    key: str
    outputs: list[int]  # indices into the walk's produced tensors (Walk.produced)
    views: list[int]  # indices of the view nodes
    tokens: list[Any]  # the graph's shape cache entries, held: the fingerprint names them by id


_recalled: dict[tuple, _Recalled] = {}
MAX_RECALLED = 64


def _recall(
    graph: Graph, walk: liveness.Walk, live: set[int], entry: _Recalled, storages: list[tuple[torch.Tensor, int, int]]
) -> Plan:
    """The plan of ``graph`` from the one planned for a graph with the same fingerprint (no slots); ``storages``:
    the data of the first input on each storage it reads, and the window of it the inputs span."""
    seen, nodes = walk.seen, graph.nodes
    return Plan(
        [window(arrays.buffer(elem), low, high) for elem, low, high in storages],
        None,
        [seen[walk.produced[i]] for i in entry.outputs],
        walk.floats,
        entry.key,
        [nodes[i] for i in entry.views],
        live,
    )


def _remember(graph: Graph, walk: liveness.Walk, fingerprint: tuple, graph_plan: Plan) -> None:
    """Keep ``graph_plan``'s key and positions for the graphs with this fingerprint."""
    if len(_recalled) >= MAX_RECALLED:
        _recalled.clear()
    seen = walk.seen
    position = {id(seen[number]): i for i, number in enumerate(walk.produced)}
    view_index = {id(node): i for i, node in enumerate(graph.nodes) if node.func.is_view}
    _recalled[fingerprint] = _Recalled(
        graph_plan.key,
        [position[id(t)] for t in graph_plan.outputs],
        [view_index[id(node)] for node in graph_plan.views],
        walk.tokens,
    )
