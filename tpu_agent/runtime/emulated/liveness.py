"""Which tensors a flushed DeferAndFuse graph produces that the program can still read (:func:`live_results`).

A compiling executor returns only those from its executable, so XLA fuses the rest of a training step's
intermediates away instead of writing every activation and gradient to memory. The answer comes from
reference counts: Python's (``sys.getrefcount``) and C++'s (a tensor's use count), less what the graph's own
nodes and containers hold and what torch's view bookkeeping adds, which is measured once on the running torch
(:func:`_measure`) rather than assumed. Every doubt resolves to "live": a wrong guess costs a slower
executable, never a wrong value.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tpu_agent.runtime.emulated import tensor as tt

if TYPE_CHECKING:
    from tpu_agent.runtime.emulated.deferred import Graph


def _ref_counts(objects: list) -> list[int]:
    return [sys.getrefcount(o) for o in objects]


# What _ref_counts' own bookkeeping adds to each count (the list's slot, the loop variable, the call's argument):
# measured on an object only that list holds, so the figure is right for this interpreter whatever it is.
_OWN_REFS = _ref_counts([object()])[0]


class Walk:
    """One pass over a graph's nodes, read by both :func:`live_results` and the XLA planner.

    Every tensor and container in the nodes is numbered in the order first met (its position in ``seen``; host
    tensors, which reference counting leaves out, get negative numbers), with the slots of the nodes and their
    containers that reference it (``counts``). ``fingerprint`` is the graph's structure: per node its shape
    cache entry (:attr:`Node.inferred`: the op, its tensor arguments' layouts, its other arguments' values) and
    precision, and the number of every tensor and container it reads or returns. Two graphs with equal
    fingerprints differ only in their objects and floats; ``None`` when a node has no shape cache entry."""

    __slots__ = (
        "seen",
        "counts",
        "contents",
        "produced",
        "inputs",
        "floats",
        "fingerprint",
        "tokens",
        "_index",
        "_items",
    )

    def __init__(self, graph: Graph) -> None:
        self.seen: list = []  # every tpu tensor and container met, once
        self.counts: list[int] = []  # per seen object, the slots of the nodes and their containers referencing it
        self.contents: dict[int, list[int]] = {}  # position of a container -> ids of the tensors in it, any depth
        self.produced: list[int] = []  # positions of the tensors first met as a node's output
        self.inputs: list[Any] = []  # tensors first met as arguments (tpu and host), in order
        self.floats: list[float] = []  # the nodes' float arguments, in order
        self.tokens: list[Any] = []  # the nodes' shape cache entries: held, so their ids in the fingerprint stay theirs
        self._index: dict[int, int] = {}  # id -> number
        self._items: list[Any] = []  # the fingerprint, while it is written
        self._walk(graph)
        self.fingerprint: tuple | None = tuple(self._items) if len(self.tokens) == len(graph.nodes) else None
        del self._index, self._items

    def _walk(self, graph: Graph) -> None:
        seen, counts, produced, tokens, index = self.seen, self.counts, self.produced, self.tokens, self._index
        append, visit, enter, tpu_tensor = self._items.append, self._visit, self._enter, tt.TpuTensor
        for node in graph.nodes:
            token = node.inferred
            if token is not None:
                tokens.append(token)
            append(id(token))
            append(node.precision)
            args = node.args
            if type(args) is tuple and id(args) not in index:  # a node's own arguments: the common case
                enter(args, tuple, False)
            else:
                visit(args, False)
            if node.kwargs:
                visit(node.kwargs, False)
            outputs = node.outputs
            if type(outputs) is tpu_tensor:  # the common case, inlined
                number = index.get(id(outputs))
                if number is None:
                    number = index[id(outputs)] = len(seen)
                    seen.append(outputs)
                    counts.append(1)
                    produced.append(number)
                else:
                    counts[number] += 1
                append(number)
            else:
                visit(outputs, True)

    def _visit(self, value: Any, is_output: bool) -> list[int]:
        """Count one reference to ``value``; the ids of the tpu tensors in it."""
        key = id(value)
        index, kind = self._index, type(value)
        number = index.get(key)
        if number is not None:
            self._items.append(number)
            if number < 0:  # a host tensor
                return []
            self.counts[number] += 1
            return [key] if kind is tt.TpuTensor else self.contents.get(number, [])
        if kind is tt.TpuTensor:
            number = index[key] = len(self.seen)
            self.seen.append(value)
            self.counts.append(1)
            if is_output:
                self.produced.append(number)
            else:
                self.inputs.append(value)
            self._items.append(number)
            return [key]
        if kind is tuple or kind is list or kind is dict:
            return self._enter(value, kind, is_output)
        if kind is float:
            self.floats.append(value)
        elif isinstance(value, torch.Tensor):  # a host tensor the op captured: an input, never a result
            number = index[key] = -1 - len(self.inputs)
            self.inputs.append(value)
            self._items.append(number)
        return []

    def _enter(self, container: Any, kind: type, is_output: bool) -> list[int]:
        """Number a container met for the first time and visit its items (tpu tensors and floats inline)."""
        seen, counts, index, tpu_tensor = self.seen, self.counts, self._index, tt.TpuTensor
        append = self._items.append
        number = index[id(container)] = len(seen)
        seen.append(container)
        counts.append(1)
        append(kind)
        found: list[int] = []
        for item in container.values() if kind is dict else container:
            item_kind = type(item)
            if item_kind is int:  # sizes and dims
                continue
            if item_kind is tpu_tensor:
                item_key = id(item)
                item_number = index.get(item_key)
                if item_number is None:
                    item_number = index[item_key] = len(seen)
                    seen.append(item)
                    counts.append(1)
                    if is_output:
                        self.produced.append(item_number)
                    else:
                        self.inputs.append(item)
                else:
                    counts[item_number] += 1
                append(item_number)
                found.append(item_key)
            elif item_kind is float:
                self.floats.append(item)
            else:
                found += self._visit(item, is_output)
        self.contents[number] = found
        return found


@dataclass(frozen=True)
class _Costs:
    """What torch's own bookkeeping adds to a tensor's reference counts, measured on this torch (see _measure).

    ``view_root`` and ``view_ancestor``: C++ references one view adds to its ``_base`` and to each view between
    them (torch's view records hold both). ``shared``: Python references torch adds while C++ shares a tensor
    (it keeps a subclass's Python object alive for its C++ owners)."""

    view_root: int = 0
    view_ancestor: int = 0
    shared: int = 0


_NOTHING_KNOWN = _Costs()  # every reference counts as the program's: bases and shared tensors stay live


def _measure() -> _Costs:
    """Make views of a tpu tensor and watch its counts (outside any dispatch: inside one, torch records no views).
    A measurement that fits no such rule yields :data:`_NOTHING_KNOWN` (slower executables, never wrong ones)."""
    root = tt.wrap(torch.empty(4))
    python_before = sys.getrefcount(root)
    first = root.view(4)
    shared = sys.getrefcount(root) - python_before
    before = (root._use_count(), first._use_count())
    second = first.view(4)
    middle = (root._use_count(), first._use_count())
    third = second.view(4)
    after = (root._use_count(), first._use_count(), second._use_count())
    del third
    view_root, view_ancestor = middle[0] - before[0], middle[1] - before[1]
    if (
        view_root <= 0
        or shared not in (0, 1)
        or after != (middle[0] + view_root, middle[1] + view_ancestor, 1 + view_ancestor)
    ):
        return _NOTHING_KNOWN
    return _Costs(view_root, view_ancestor, shared)


_measured: list[_Costs] = []  # once, at the first flush outside a dispatch


def _costs() -> _Costs:
    if not _measured:
        if torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.ADInplaceOrView):
            return _NOTHING_KNOWN  # flushed from inside a dispatch: measure at a later flush
        _measured.append(_measure())
    return _measured[0]


def _view_references(graph: Graph, views: list, costs: _Costs) -> dict[int, int]:
    """id -> the use-count references the graph's own views hold on it (to be told apart from the program's)."""
    if not views or not costs.view_root:
        return {}
    parent: dict[int, int] = {}  # id of a produced view -> id of the tensor it was made from
    for node in graph.nodes:
        if node.func.is_view:
            source = next((a for a in node.args if type(a) is tt.TpuTensor), None)
            if source is not None:
                for out in tensors_in(node.outputs):
                    parent[id(out)] = id(source)
    refs: dict[int, int] = {}
    for view in views:
        base = id(view._base)
        refs[base] = refs.get(base, 0) + costs.view_root
        ancestor = parent.get(id(view))
        while ancestor is not None and ancestor != base:
            refs[ancestor] = refs.get(ancestor, 0) + costs.view_ancestor
            ancestor = parent.get(ancestor)
    return refs


def live_results(graph: Graph, walk: Walk | None = None) -> set[int]:
    """The ids of the tensors ``graph`` produces that something outside the graph can still read after the flush.

    A produced tensor is live when anything but the graph's nodes references it: Python (a variable, a module, an
    optimizer's state, a running frame), C++ (autograd's saved tensors, a ``.grad``, a view's ``_base``: seen in
    the tensor's use count, less the ``_base`` references of the graph's own views) or a container of the nodes
    that is itself referenced from outside (an outputs tuple the program kept). The rest are intermediates the
    program can no longer reach: once the nodes are gone, so are they. An executor that compiles the graph
    returns only the live ones, so XLA fuses the others away instead of writing them to memory (a training
    step's graph otherwise returns every activation and gradient). A live view needs its base's data: the bases
    of live views are live too.

    Counting is conservative: a reference it cannot attribute to the graph keeps the tensor live. While it
    counts, the only extra reference to each object is its slot in ``seen`` (which :data:`_OWN_REFS` covers).
    ``walk``: the graph's :class:`Walk`, when the caller made one (it holds no other reference to a result)."""
    if walk is None:
        walk = Walk(graph)
    seen = walk.seen
    ref_counts = _ref_counts(seen)
    produced = {id(seen[number]) for number in walk.produced}
    views = [seen[number] for number in walk.produced if seen[number]._is_view()]
    costs = _costs()
    view_refs = _view_references(graph, views, costs)
    del views
    counts, contents = walk.counts, walk.contents
    live: set[int] = set()
    for number, (value, refs) in enumerate(zip(seen, ref_counts, strict=True)):
        if type(value) is tt.TpuTensor:
            shared = value._use_count() - 1
            python = refs - _OWN_REFS - (costs.shared if shared else 0)
            if python > counts[number] or shared > view_refs.get(id(value), 0):
                live.add(id(value))
        elif refs - _OWN_REFS > counts[number]:
            live.update(contents[number])
    for node in reversed(graph.nodes):  # views after their bases: a chain of views reaches its first base
        if node.func.is_view and any(id(t) in live for t in tensors_in(node.outputs)):
            live.update(id(t) for t in tensors_in(node.args))
    return live & produced


def tensors_in(value: Any) -> list:
    """The tensors in ``value`` (a tensor, or nested lists and tuples of them), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []
