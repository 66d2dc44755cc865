"""The DeferAndFuse executor that compiles: a captured graph becomes one XLA executable, cached across steps.

The recorded graph is imperative: in-place ops write into tensors that existed before it (parameters,
optimizer state, ``total += x``), views share storage with their bases, and materialised inputs can be views of
one another (``w`` and ``w.t()``). XLA programs are pure. So a graph is first *planned*
(:func:`plan`): its inputs are the storages it reads (every tpu tensor it did not produce, and host tensors it
captured), each passed once as a flat buffer from which the replay cuts every view it uses (``as_strided``).
The replay of the nodes is then traced by ``make_fx`` under functionalisation: mutations and views become
pure ops plus a final write-back into the input buffers, which :mod:`.lowering` returns as extra outputs and
this executor copies back into the real storages, so every alias sees the new values as in Strict mode.

Only the produced tensors the program can still read (:func:`deferred.live_results`) are outputs of the
executable; the others never leave it, so XLA fuses them away. After the run, results are given to the graph's
live deferred tensors: a view op's output becomes a view of its
base's data again (the same strides and offset its metadata promised), so later in-place writes through it
reach the base, as on the CPU executor.

Every matmul in the replay goes through :func:`kernels.run_on_cpu` with the precision recorded for its node,
so the rounding is the eager emulation's own, traced into the program. Graphs the plan cannot express
(views across dtypes of one storage, ops that do not trace) run on the CPU executor instead, with a
FallbackOp record; never with a different result.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import deferred, kernels, state
from tpu_agent.runtime.emulated import tensor as tt
from tpu_agent.runtime.emulated.deferred import CpuExecutor, Graph
from tpu_agent.runtime.xla import cache, decompositions, graphs
from tpu_agent.runtime.xla.graphs import GraphRunner

_CPU = torch.device("cpu")


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


def _tensors_in(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


_TENSOR_TYPES = (tt.TpuTensor, torch.Tensor, torch.nn.Parameter)


class _Planner:
    """One pass over the nodes: numbers every tensor, registers the inputs' storages, writes the key."""

    def __init__(self, live: set[int] | None = None) -> None:
        # ids of the produced tensors the program can still read (deferred.live_results); None: all of them
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


def plan(graph: Graph) -> Plan:
    """Inputs, output tensors and a structural cache key for ``graph`` (raises :class:`NotPlannable`).

    Only the produced tensors the program can still read are outputs (:func:`deferred.live_results`); which
    ones those are is part of the key, so a step that keeps another tensor compiles an executable that returns it."""
    planner = _Planner(deferred.live_results(graph))
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


def _replay_function(graph: Graph, graph_plan: Plan, floats: list[float]) -> Callable[..., list[torch.Tensor]]:
    """The graph as a function of its input buffers, returning its output tensors' final values; the nodes'
    float arguments are taken from ``floats`` (in :func:`plan`'s order)."""
    nodes = graph.nodes
    slots = graph_plan.slots
    outputs = graph_plan.outputs

    def replay(*buffers: torch.Tensor) -> list[torch.Tensor]:
        values: dict[int, torch.Tensor] = {}
        next_float = iter(floats)

        def value_of(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                found = values.get(id(x))
                if found is None:
                    slot = slots[id(x)]
                    found = values[id(x)] = buffers[slot.buffer].as_strided(slot.shape, slot.stride, slot.offset)
                return found
            if isinstance(x, (list, tuple)):
                return type(x)(value_of(v) for v in x)
            if isinstance(x, torch.device):
                return _CPU
            if type(x) is float:
                return next(next_float)
            return x

        for node in nodes:
            args = [value_of(a) for a in node.args]
            kwargs = {k: value_of(v) for k, v in node.kwargs.items()} if node.kwargs else {}
            out = kernels.run_on_cpu(node.func, args, kwargs, node.precision)
            _bind(node.outputs, out, values)
        return [values[id(t)] for t in outputs]

    return replay


def _bind(wrapped: Any, out: Any, values: dict[int, torch.Tensor]) -> None:
    if isinstance(wrapped, torch.Tensor) and isinstance(out, torch.Tensor):
        values.setdefault(id(wrapped), out)
    elif isinstance(wrapped, (list, tuple)) and isinstance(out, (list, tuple)):
        for w, o in zip(wrapped, out, strict=False):
            _bind(w, o, values)


def trace(graph: Graph, graph_plan: Plan, floats: list[float]) -> torch.fx.GraphModule:
    """The functional ATen graph of the replay (mutations turned into a final write-back into the buffers)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    replay = torch.func.functionalize(_replay_function(graph, graph_plan, floats), remove="mutations_and_views")
    # A flush often runs inside the tpu tensor's __torch_dispatch__ (a host read), below autograd, where torch
    # has switched off every dispatch key above the backend; the tracer's functionalisation needs them back.
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), _top_level_exclusions()):
        return make_fx(replay, decomposition_table=decompositions.table(), tracing_mode="fake")(*graph_plan.buffers)


def _top_level_exclusions() -> torch._C.DispatchKeySet:
    """The thread's excluded dispatch keys as outside any dispatch: only the autocast keys (autocast off)."""
    current = torch._C._dispatch_tls_local_exclude_set()
    kept = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
    for name in dir(torch._C.DispatchKey):
        if name.startswith("Autocast"):
            key = getattr(torch._C.DispatchKey, name)
            if current.has(key):
                kept = kept.add(key)
    return kept


def _probe_values(floats: list[float]) -> list[float]:
    """Distinct stand-ins for the graph's floats, each unlike any constant a trace could contain by itself."""
    return [
        v * 1.000244140625 + 7.62939453125e-06 * (i + 1) + 0.00048828125 if v and math.isfinite(v) else v
        for i, v in enumerate(floats)
    ]


# Ops whose lowering branches in Python on a float argument (``native_dropout``'s decomposition tests ``p != 0``):
# a float reaching them stays a constant of the executable, and its value part of the cache key.
_CONCRETE_FLOAT_OPS = frozenset(
    {
        torch.ops.aten.native_dropout.default,
        torch.ops.aten.dropout.default,
        torch.ops.aten.bernoulli.p,
        torch.ops.aten.bernoulli_.float,
    }
)


def lift_floats(graph: Graph, graph_plan: Plan) -> tuple[torch.fx.GraphModule, tuple[int, ...] | None]:
    """The traced graph with the nodes' float arguments turned into inputs after the buffers.

    An optimizer's learning rate and bias corrections are Python floats that change every step; baked into
    the program they would recompile it every step. The replay is traced twice, with the real floats and with
    distinct probe values: a literal that holds probe ``i`` in the second trace and float ``i`` in the first is
    float ``i`` flowing straight into an op, and becomes input ``i``. If the traces differ anywhere else (a
    float shaped the graph or was transformed by a decomposition), nothing is lifted and the second value is
    None: the floats stay constants of this executable and must be part of its cache key. Otherwise the second
    value names the floats that stay constants all the same (those reaching :data:`_CONCRETE_FLOAT_OPS`): their
    values key the executable."""
    baked = trace(graph, graph_plan, graph_plan.floats)
    if not graph_plan.floats:
        return baked, ()
    probes = _probe_values(graph_plan.floats)
    try:
        probed = trace(graph, graph_plan, probes)
    except Exception:  # noqa: BLE001 - an op refused a probe value (it checks the float): keep the floats baked
        return baked, None
    index_of_probe = {p: i for i, p in enumerate(probes) if p != graph_plan.floats[i]}
    real_nodes, probe_nodes = list(baked.graph.nodes), list(probed.graph.nodes)
    if len(real_nodes) != len(probe_nodes):
        return baked, None
    uses: list[tuple[torch.fx.Node, list[Any], dict[str, Any]]] = []
    lifted: set[int] = set()
    concrete: set[int] = set()
    for real, probe in zip(real_nodes, probe_nodes, strict=True):
        if real.op != probe.op or real.target != probe.target:
            return baked, None
        matched = _match_literals(
            (real.args, real.kwargs),
            (probe.args, probe.kwargs),
            graph_plan.floats,
            index_of_probe,
            concrete if real.target in _CONCRETE_FLOAT_OPS else lifted,
            keep_value=real.target in _CONCRETE_FLOAT_OPS,
        )
        if matched is None:
            return baked, None
        if matched:
            uses.append((probe, *matched))
    last_input = [n for n in probe_nodes if n.op == "placeholder"][-1]
    scalars: dict[int, torch.fx.Node] = {}
    with probed.graph.inserting_after(last_input):
        for i in sorted(lifted, reverse=True):
            scalars[i] = probed.graph.placeholder(f"scalar_{i}")
    for node, args, kwargs in uses:
        node.args = _substitute(tuple(args), scalars)
        node.kwargs = _substitute(kwargs, scalars)
    # inputs in order: buffers, then every float (unused ones are harmless inputs of the program)
    order = [n for n in probed.graph.nodes if n.op == "placeholder"]
    for i in range(len(graph_plan.floats)):
        if i not in scalars:
            with probed.graph.inserting_after(order[-1]):
                scalars[i] = probed.graph.placeholder(f"scalar_{i}")
            order.append(scalars[i])
    _reorder_placeholders(probed.graph, len(graph_plan.buffers), scalars)
    probed.recompile()
    return probed, tuple(sorted(concrete))


class _Lifted:
    """A literal to become input ``index``."""

    def __init__(self, index: int) -> None:
        self.index = index


def _match_literals(
    real: Any,
    probe: Any,
    floats: list[float],
    index_of_probe: dict[float, int],
    lifted: set[int],
    keep_value: bool = False,
) -> Any:
    """``probe`` with lifted literals replaced by :class:`_Lifted` markers (with ``keep_value``: by the real
    value, the float's index still added to ``lifted``), or None when the traces differ elsewhere; an empty
    tuple when nothing in it is lifted."""
    changed = False

    def walk(r: Any, p: Any) -> Any:
        nonlocal changed
        if isinstance(r, (list, tuple)) and isinstance(p, (list, tuple)) and len(r) == len(p):
            return type(p)(walk(a, b) for a, b in zip(r, p, strict=True))
        if isinstance(r, dict) and isinstance(p, dict) and r.keys() == p.keys():
            return {k: walk(r[k], p[k]) for k in p}
        if type(p) is float and p in index_of_probe and type(r) is float:
            i = index_of_probe[p]
            if r == floats[i] or (math.isnan(r) and math.isnan(floats[i])):
                lifted.add(i)
                changed = True
                return r if keep_value else _Lifted(i)
            raise _Differs
        if isinstance(r, torch.fx.Node) and isinstance(p, torch.fx.Node):
            return p
        if r == p or (type(r) is float and type(p) is float and math.isnan(r) and math.isnan(p)):
            return p
        raise _Differs

    try:
        args, kwargs = walk(real, probe)
    except _Differs:
        return None
    return (list(args), kwargs) if changed else ()


class _Differs(Exception):
    pass


def _substitute(value: Any, scalars: dict[int, torch.fx.Node]) -> Any:
    if isinstance(value, _Lifted):
        return scalars[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(v, scalars) for v in value)
    if isinstance(value, dict):
        return {k: _substitute(v, scalars) for k, v in value.items()}
    return value


def _reorder_placeholders(graph: torch.fx.Graph, buffers: int, scalars: dict[int, torch.fx.Node]) -> None:
    """Placeholders in call order: the buffers as traced, then ``scalar_0, scalar_1, ...``."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder" and n not in scalars.values()]
    anchor = placeholders[buffers - 1] if buffers else None
    for i in sorted(scalars):
        if anchor is None:
            first = next(iter(graph.nodes))
            first.prepend(scalars[i])
        else:
            anchor.append(scalars[i])
        anchor = scalars[i]


class XlaExecutor:
    """Runs captured DeferAndFuse graphs as XLA executables; the CPU executor takes what cannot be planned."""

    def __init__(self) -> None:
        self.cpu = CpuExecutor()
        # by structural key (floats left out) and the values of the floats that stay constants;
        # None: this graph runs on the CPU executor
        self.runners: dict[tuple[str, tuple[float, ...]], GraphRunner | None] = {}
        # per structural key, which floats stay constants (lift_floats; None: all of them)
        self.constants: dict[str, tuple[int, ...] | None] = {}

    def _key(self, graph_plan: Plan) -> tuple[str, tuple[float, ...]]:
        constants = self.constants.get(graph_plan.key, ())
        floats = graph_plan.floats
        return graph_plan.key, tuple(floats) if constants is None else tuple(floats[i] for i in constants)

    def run(self, graph: Graph, cause: str) -> None:
        key = None
        try:
            graph_plan = plan(graph)
            key = self._key(graph_plan)
            if key in self.runners:
                runner = self.runners[key]
            else:
                key, runner = self._build(graph, graph_plan)
            if runner is not None:
                # inputs are written back only after the executable ran, so a failure here leaves them intact
                results = runner(*graph_plan.buffers, *graph_plan.floats, specialisation=graph_plan.key)
                _materialise(graph, graph_plan, results)
                return
        except Exception as error:  # noqa: BLE001 - never a crash: the op-by-op executor runs what XLA cannot take
            if key is not None:
                self._remember(key, None)
            for observe in graphs.fallback_observers:
                observe(f"deferred graph {graph.hash}", f"deferred graph {graph.hash} ({len(graph.nodes)} ops)", error)
            if state.log_enabled:
                events.emit(
                    events.FallbackOp,
                    op=f"deferred graph ({type(error).__name__}: {error})"[:300],
                    site=graph.nodes[0].site,
                )
        self.cpu.run(graph, cause)

    def _build(self, graph: Graph, graph_plan: Plan) -> tuple[tuple[str, tuple[float, ...]], GraphRunner]:
        gm, constants = lift_floats(graph, graph_plan)
        if constants is None:
            gm = _with_float_inputs(gm, len(graph_plan.floats))
        self.constants[graph_plan.key] = constants
        key = self._key(graph_plan)
        # each node's matmul rounding is traced into the graph (kernels.run_on_cpu at its recorded precision)
        runner = GraphRunner(gm, f"deferred graph {graph.hash}", graph.nodes[0].site, state.Precision.HIGHEST)
        self._remember(key, runner)
        return key, runner

    def _remember(self, key: tuple[str, tuple[float, ...]], runner: GraphRunner | None) -> None:
        if len(self.runners) >= cache.MAX_EXECUTABLES:
            self.runners.clear()
        self.runners[key] = runner


def _with_float_inputs(gm: torch.fx.GraphModule, count: int) -> torch.fx.GraphModule:
    """``gm`` taking (and ignoring) the float inputs every call passes, for graphs whose floats are baked in."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    with gm.graph.inserting_after(placeholders[-1]) if placeholders else gm.graph.inserting_before(None):
        for i in range(count):
            gm.graph.placeholder(f"unused_scalar_{i}")
    gm.recompile()
    return gm


def _materialise(graph: Graph, graph_plan: Plan, results: list[torch.Tensor]) -> None:
    """Give the graph's deferred tensors their data: results for computed tensors, views for view outputs."""
    for wrapper, value in zip(graph_plan.outputs, results, strict=True):
        if wrapper._elem is None:
            tt.materialized(wrapper, _with_layout(value, wrapper))
    live = graph_plan.live
    for node in graph_plan.views:
        base = next(t for t in _tensors_in(node.args) if type(t) is tt.TpuTensor)
        for view in _tensors_in(node.outputs):
            if type(view) is tt.TpuTensor and view._elem is None and (live is None or id(view) in live):
                assert base._elem is not None  # the base was materialised before its views (graph order)
                tt.materialized(view, base._elem.as_strided(view.shape, view.stride(), view.storage_offset()))


def _with_layout(value: torch.Tensor, wrapper: Any) -> torch.Tensor:
    """``value`` with the strides and offset the deferred tensor's metadata promised (views are cut from it)."""
    if value.stride() == wrapper.stride() and value.storage_offset() == wrapper.storage_offset():
        return value
    extent = (
        wrapper.storage_offset() + sum((n - 1) * s for n, s in zip(wrapper.shape, wrapper.stride(), strict=True)) + 1
    )
    buffer = torch.empty(max(extent, 1), dtype=value.dtype)
    out = buffer.as_strided(wrapper.shape, wrapper.stride(), wrapper.storage_offset())
    out.copy_(value)
    return out


__all__ = ["XlaExecutor", "plan", "trace"]
