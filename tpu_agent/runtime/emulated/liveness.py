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
    from tpu_agent.runtime.emulated.deferred import Graph, Node


def _ref_counts(objects: list) -> list[int]:
    return [sys.getrefcount(o) for o in objects]


# What _ref_counts' own bookkeeping adds to each count (the list's slot, the loop variable, the call's argument):
# measured on an object only that list holds, so the figure is right for this interpreter whatever it is.
_OWN_REFS = _ref_counts([object()])[0]


class Walk:
    """One pass over a graph's nodes, read by both :func:`live_results` and the XLA planner.

    Every tensor and nested container in the nodes is numbered in the order first met (its position in ``seen``;
    host tensors, which reference counting leaves out, get negative numbers), with the slots of the nodes and their
    containers that reference it (``counts``). A node's own argument tuple is not numbered: the dispatcher builds
    it for the call, so only the node holds it, and its items count as the node's slots. ``fingerprint`` is the
    graph's structure: per node its shape cache entry (:attr:`Node.inferred`: the op, its tensor arguments'
    layouts, its other arguments' values) and precision, and the number of every tensor and container it reads or
    returns. Two graphs with equal fingerprints differ only in their objects and floats; ``None`` when a node has
    no shape cache entry. ``views``: the nodes of view ops, in graph order (the only nodes liveness follows
    from a view to its base)."""

    __slots__ = (
        "seen",
        "counts",
        "contents",
        "produced",
        "inputs",
        "floats",
        "fingerprint",
        "tokens",
        "views",
        "_index",
        "_items",
    )

    def __init__(self, graph: Graph) -> None:
        self.seen: list = []  # every tpu tensor and nested container met, once
        self.counts: list[int] = []  # per seen object, the slots of the nodes and their containers referencing it
        self.contents: dict[int, list[int]] = {}  # position of a container -> ids of the tensors in it, any depth
        self.produced: list[int] = []  # positions of the tensors first met as a node's output
        self.inputs: list[Any] = []  # tensors first met as arguments (tpu and host), in order
        self.floats: list[float] = []  # the nodes' float arguments, in order
        self.tokens: list[Any] = []  # the nodes' shape cache entries: held, so their ids in the fingerprint stay theirs
        self.views: list[Node] = []
        self._index: dict[int, int] = {}  # id -> number
        self._items: list[Any] = []  # the fingerprint, while it is written
        self._walk(graph)
        self.fingerprint: tuple | None = tuple(self._items) if len(self.tokens) == len(graph.nodes) else None
        del self._index, self._items

    def _walk(self, graph: Graph) -> None:
        seen, counts, produced, inputs, tokens, index = (
            self.seen,
            self.counts,
            self.produced,
            self.inputs,
            self.tokens,
            self._index,
        )
        append, visit, tpu_tensor, floats = self._items.append, self._visit, tt.TpuTensor, self.floats
        views = self.views
        for node in graph.nodes:
            token = node.inferred
            if token is not None:
                tokens.append(token)
            append(id(token))
            append(node.precision)
            if node.func.is_view:
                views.append(node)
            for item in node.args:  # the node's own tuple: its items inline, tpu tensors first (the common case)
                item_kind = type(item)
                if item_kind is tpu_tensor:
                    key = id(item)
                    number = index.get(key)
                    if number is None:
                        number = index[key] = len(seen)
                        seen.append(item)
                        counts.append(1)
                        inputs.append(item)
                    else:
                        counts[number] += 1
                    append(number)
                elif item_kind is int:  # sizes and dims: the shape cache entry holds their values
                    continue
                elif item_kind is float:
                    floats.append(item)
                elif item_kind is list or item_kind is tuple:
                    for nested in item:  # a size list (a view's, a factory's) holds no tensor: not numbered
                        if type(nested) is not int:
                            visit(item, False)
                            break
                else:
                    visit(item, False)
            if node.kwargs:
                visit(node.kwargs, False)
            outputs = node.outputs
            if type(outputs) is tpu_tensor:  # the common case, inlined
                key = id(outputs)
                number = index.get(key)
                if number is None:
                    number = index[key] = len(seen)
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


def _view_references(walk: Walk, produced: set[int], costs: _Costs) -> dict[int, int]:
    """id -> the use-count references the graph's own views hold on it (to be told apart from the program's).

    Only view ops make views, so only their outputs are asked (a view missed here would keep its base live,
    never the reverse)."""
    if not walk.views or not costs.view_root:
        return {}
    parent: dict[int, int] = {}  # id of a produced view -> id of the tensor it was made from
    bases = []  # (id of a produced view, id of its _base)
    tpu_tensor = tt.TpuTensor
    for node in walk.views:
        source = None
        for a in node.args:
            if type(a) is tpu_tensor:
                source = a
                break
        outputs = node.outputs
        for out in (outputs,) if type(outputs) is tpu_tensor else tensors_in(outputs):
            key = id(out)
            if source is not None:
                parent[key] = id(source)
            if key in produced:
                base = out._base  # None: not a view (one torch call, where _is_view and _base would be two)
                if base is not None:
                    bases.append((key, id(base)))
    refs: dict[int, int] = {}
    view_root, view_ancestor = costs.view_root, costs.view_ancestor
    for key, base in bases:
        refs[base] = refs.get(base, 0) + view_root
        ancestor = parent.get(key)
        while ancestor is not None and ancestor != base:
            refs[ancestor] = refs.get(ancestor, 0) + view_ancestor
            ancestor = parent.get(ancestor)
    return refs


def live_results(graph: Graph, walk: Walk | None = None) -> set[int]:
    """The ids of the tensors ``graph`` produces that something outside the graph can still read after the flush.

    A produced tensor is live when anything but the graph's nodes references it: Python (a variable, a module, an
    optimizer's state, a running frame), C++ (autograd's saved tensors, a ``.grad``, a view's ``_base``: seen in
    the tensor's use count, less the ``_base`` references of the graph's own views) or a container of the nodes
    that is itself referenced from outside (an outputs tuple the program kept, a node's argument tuple held by
    anything but its node). The rest are intermediates the program can no longer reach: once the nodes are gone,
    so are they. An executor that compiles the graph returns only the live ones, so XLA fuses the others away
    instead of writing them to memory (a training step's graph otherwise returns every activation and gradient).
    A live view needs its base's data: the bases of live views are live too.

    Counting is conservative: a reference it cannot attribute to the graph keeps the tensor live. While it
    counts, the only extra reference to each object is its slot in ``seen`` (which :data:`_OWN_REFS` covers).
    ``walk``: the graph's :class:`Walk`, when the caller made one (it holds no other reference to a result)."""
    if walk is None:
        walk = Walk(graph)
    seen, counts, contents, tpu_tensor = walk.seen, walk.counts, walk.contents, tt.TpuTensor
    ref_counts = _ref_counts(seen)
    produced = {id(seen[number]) for number in walk.produced}
    costs = _costs()
    view_refs = _view_references(walk, produced, costs)
    shared_cost = costs.shared
    live: set[int] = set()
    own = _OWN_REFS
    for number in walk.produced:  # the tensors first met as arguments are the graph's inputs: never results
        value = seen[number]
        excess = ref_counts[number] - own - counts[number]  # references from outside the nodes and containers
        if excess > shared_cost:  # live whatever C++ holds: its use count need not be read
            live.add(id(value))
            continue
        shared = value._use_count() - 1
        if (excess > shared_cost if shared else excess > 0) or shared > view_refs.get(id(value), 0):
            live.add(id(value))
    for number, found in contents.items():
        if ref_counts[number] - own > counts[number]:
            live.update(found)
    arguments = [node.args for node in graph.nodes]
    held = _ref_counts(arguments)
    if max(held, default=0) - own > 1:  # a tuple held by more than its node (never the dispatcher's): all live
        for args, refs in zip(arguments, held, strict=True):
            if refs - own > 1:
                live.update(id(t) for t in tensors_in(args))
    del arguments
    for node in reversed(walk.views):  # views after their bases: a chain of views reaches its first base
        outputs = node.outputs
        if id(outputs) in live if type(outputs) is tpu_tensor else any(id(t) in live for t in tensors_in(outputs)):
            live.update([id(t) for t in tensors_in(node.args)])
    return live & produced


def tensors_in(value: Any) -> list:
    """The tensors in ``value`` (a tensor, or nested lists and tuples of them), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []
