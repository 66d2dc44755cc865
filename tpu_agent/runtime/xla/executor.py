"""The DeferAndFuse executor that compiles: a captured graph becomes one XLA executable, cached across steps.

A flushed graph is planned (:mod:`.planning`: input buffers, live outputs, a structural key), traced into one
functional ATen graph with its floats lifted into inputs (:mod:`.tracing`) and compiled once per key
(:class:`GraphRunner`). The executable returns the live results and the final values of the input buffers it
wrote, which this executor copies back into the real storages, so every alias sees the new values as in Strict
mode. Results are then given to the graph's live deferred tensors: a view op's output becomes a view of its
base's data again (the same strides and offset its metadata promised), so later in-place writes through it
reach the base, as on the CPU executor.

Graphs the plan cannot express (views across dtypes of one storage, ops that do not trace) run on the CPU
executor instead, with a FallbackOp record; never with a different result.
"""

from __future__ import annotations

import torch

from tpu_agent.runtime.emulated import liveness, state
from tpu_agent.runtime.emulated import tensor as tt
from tpu_agent.runtime.emulated.deferred import CpuExecutor, Graph
from tpu_agent.runtime.emulated.flush_cause import FlushCause
from tpu_agent.runtime.xla import arrays, cache, graphs, planning, tracing
from tpu_agent.runtime.xla.graphs import GraphRunner
from tpu_agent.runtime.xla.planning import Plan


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

    def run(self, graph: Graph, cause: FlushCause) -> None:
        key = None
        arrays.sweep()  # the storages of tensors gone since the last flush are freed, not kept as inputs
        try:
            graph_plan = planning.plan(graph)
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
            graphs.report_fallback(f"deferred graph {graph.hash}", len(graph.nodes), error, graph.nodes[0].site)
        self.cpu.run(graph, cause)

    def _build(self, graph: Graph, graph_plan: Plan) -> tuple[tuple[str, tuple[float, ...]], GraphRunner]:
        gm, constants = _graph_module(graph, graph_plan)
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


def _graph_module(graph: Graph, graph_plan: Plan) -> tuple[torch.fx.GraphModule, tuple[int, ...] | None]:
    """The captured graph as one functional ATen graph over its buffers and its floats, and which floats stay
    constants (:func:`tracing.lift_floats`)."""
    gm, constants = tracing.lift_floats(graph, planning.complete(graph, graph_plan))
    if constants is None:
        gm = tracing.with_float_inputs(gm, len(graph_plan.floats))
    return gm, constants


def pending_stablehlo() -> str | None:
    """The StableHLO text of the pending DeferAndFuse graph as this executor would compile it, or ``None`` when
    nothing is pending (what ``torch_tpu._internal.sync.computation_mlir`` shows). Nothing runs."""
    import jax

    from tpu_agent.runtime.emulated import deferred
    from tpu_agent.runtime.xla import lowering

    with deferred._lock:  # the recorder's own lock: no op is appended while the graph is planned and traced
        graph = deferred._pending
        if not graph.nodes:
            return None
        graph_plan = planning.plan(graph)
        gm, _ = _graph_module(graph, graph_plan)
        traced = lowering.trace_graph(gm, [*graph_plan.buffers, *graph_plan.floats], state.Precision.HIGHEST)
    return str(jax.jit(traced.function).lower(*traced.abstract).as_text())


def _materialise(graph: Graph, graph_plan: Plan, results: list[torch.Tensor]) -> None:
    """Give the graph's deferred tensors their data: results for computed tensors, views for view outputs."""
    for wrapper, value in zip(graph_plan.outputs, results, strict=True):
        if wrapper._elem is None:
            tt.materialized(wrapper, arrays.laid_out(value, wrapper.stride(), wrapper.storage_offset()))
    live = graph_plan.live
    for node in graph_plan.views:
        base = next(t for t in liveness.tensors_in(node.args) if type(t) is tt.TpuTensor)
        for view in liveness.tensors_in(node.outputs):
            if type(view) is tt.TpuTensor and view._elem is None and (live is None or id(view) in live):
                assert base._elem is not None  # the base was materialised before its views (graph order)
                tt.materialized(view, base._elem.as_strided(view.shape, view.stride(), view.storage_offset()))


__all__ = ["XlaExecutor"]
