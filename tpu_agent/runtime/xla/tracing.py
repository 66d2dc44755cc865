"""A planned DeferAndFuse graph as one functional ATen graph that XLA can compile (:func:`trace`,
:func:`lift_floats`).

The replay of the nodes reads its tensors from the plan's input buffers and is traced by ``make_fx`` under
functionalisation: mutations and views become pure ops plus a final write-back into the input buffers, which
:mod:`.lowering` returns as extra outputs. Every matmul in the replay goes through :func:`kernels.run_on_cpu`
with the precision recorded for its node, so the rounding is the eager emulation's own, traced into the
program. The nodes' Python floats (an optimizer's learning rate) become inputs of the program where the trace
shows they flow straight into ops, so a changing float does not recompile it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tpu_agent.runtime.emulated import kernels
from tpu_agent.runtime.emulated.deferred import Graph
from tpu_agent.runtime.xla import decompositions, fx_names
from tpu_agent.runtime.xla.planning import Plan

fx_names.install()  # the traced graphs' code names keyword ops (aten.random.from) validly

_CPU = torch.device("cpu")


def _replay_function(graph: Graph, graph_plan: Plan, floats: list[float]) -> Callable[..., list[torch.Tensor]]:
    """The graph as a function of its input buffers, returning its output tensors' final values; the nodes'
    float arguments are taken from ``floats`` (in :func:`plan`'s order)."""
    nodes = graph.nodes
    slots = graph_plan.slots
    assert slots is not None, "a recalled plan: planning.complete gives it the slots tracing reads"
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


# Ops whose lowering branches in Python on a float argument (``native_dropout``'s decomposition tests ``p != 0``,
# a norm's order picks its formula: ``clip_grad_norm_`` passes ``norm_type`` as a float): a float reaching them
# stays a constant of the executable, and its value part of the cache key.
_CONCRETE_FLOAT_OPS = frozenset(
    {
        torch.ops.aten.native_dropout.default,
        torch.ops.aten.dropout.default,
        torch.ops.aten.bernoulli.p,
        torch.ops.aten.bernoulli_.float,
        torch.ops.aten.linalg_vector_norm.default,
        torch.ops.aten.norm.Scalar,
        torch.ops.aten.norm.ScalarOpt_dim,
        torch.ops.aten._foreach_norm.Scalar,
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


def with_float_inputs(gm: torch.fx.GraphModule, count: int) -> torch.fx.GraphModule:
    """``gm`` taking (and ignoring) the float inputs every call passes, for graphs whose floats are baked in."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    with gm.graph.inserting_after(placeholders[-1]) if placeholders else gm.graph.inserting_before(None):
        for i in range(count):
            gm.graph.placeholder(f"unused_scalar_{i}")
    gm.recompile()
    return gm
