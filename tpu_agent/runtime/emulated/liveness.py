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


class _References:
    """Counts the references the graph's own nodes and containers hold on each tensor and container in them."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}  # id -> slots of the nodes and their containers that reference the object
        self.seen: list = []  # every tensor and container met, once
        self.contents: dict[int, list[int]] = {}  # container id -> ids of the tensors inside it, at any depth
        self.produced: set[int] = set()  # tensors first met as a node's output

    def visit(self, value: Any, is_output: bool) -> list[int]:
        """Count one reference to ``value``; the ids of the tensors in it."""
        key = id(value)
        counts = self.counts
        count = counts.get(key)
        counts[key] = 1 if count is None else count + 1
        kind = type(value)
        if kind is tt.TpuTensor:
            if count is None:
                self.seen.append(value)
                if is_output:
                    self.produced.add(key)
            return [key]
        if kind is not tuple and kind is not list and kind is not dict:
            return []
        if count is not None:  # a shared container: its slots were counted once already
            return self.contents[key]
        seen = self.seen
        seen.append(value)
        found: list[int] = []
        for item in value.values() if kind is dict else value:
            item_kind = type(item)
            if item_kind is int:  # sizes and dims
                continue
            item_key = id(item)
            if item_kind is tt.TpuTensor and item_key in counts:  # seen before: one more reference (inlined)
                counts[item_key] += 1
                found.append(item_key)
            else:
                found += self.visit(item, is_output)
        self.contents[key] = found
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


def live_results(graph: Graph) -> set[int]:
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
    counts, the only extra reference to each object is its slot in ``seen`` (which :data:`_OWN_REFS` covers)."""
    references = _References()
    visit = references.visit
    for node in graph.nodes:
        visit(node.args, False)
        if node.kwargs:
            visit(node.kwargs, False)
        visit(node.outputs, True)
    seen, produced = references.seen, references.produced
    ref_counts = _ref_counts(seen)
    views = [t for t in seen if type(t) is tt.TpuTensor and id(t) in produced and t._is_view()]
    costs = _costs()
    view_refs = _view_references(graph, views, costs)
    del views
    counts, contents = references.counts, references.contents
    live: set[int] = set()
    for value, refs in zip(seen, ref_counts, strict=True):
        key = id(value)
        if type(value) is tt.TpuTensor:
            shared = value._use_count() - 1
            python = refs - _OWN_REFS - (costs.shared if shared else 0)
            if python > counts[key] or shared > view_refs.get(key, 0):
                live.add(key)
        elif refs - _OWN_REFS > counts[key]:
            live.update(contents[key])
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
