"""A recorded DeferAndFuse graph as capture-only hands it to the estimate's observers (:class:`CapturedGraph`,
traced when first read), and what of its Python floats keys it (:func:`float_shape_key`)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import torch

from tpu_agent.runtime import events


def float_shape_key(value: float) -> float | str:
    """What of a graph's Python float can change the traced program's ops, not just a constant in it.

    An optimizer's bias corrections are new floats every step; baked into the trace as constants, they would
    make every step's update graph a new one to trace (a 7B model's AdamW update: tens of seconds each time),
    though its program differs only in those constants, which no memory or time figure depends on. Decompositions
    branch on a few values (``alpha != 1``, dropout's ``p == 0``, ``pow``'s integral and half exponents, non-finite
    bounds): those values key a trace as themselves; any other float is one class."""
    if not math.isfinite(value) or value.is_integer() or abs(value) == 0.5:
        return value
    return "finite"


class CapturedGraph:
    """A DeferAndFuse graph as the estimate's observers see a graph runner: its name, site, a key of its structure
    (``signature``) and its FX graph, traced when first read.

    Tracing a graph costs about as much as recording it (a 7B model's AdamW update: seconds), and only the steady
    step's graphs are compiled: those only the first optimizer step runs (the update that creates the optimizer's
    state) are never read, so never traced."""

    def __init__(
        self, name: str, site: events.Site | None, signature: str, ops: int, trace: Callable[[], torch.fx.GraphModule]
    ) -> None:
        self.name = name
        self.site = site
        self.signature = signature
        self.ops = ops
        self._trace: Callable[[], torch.fx.GraphModule] | None = trace
        self._gm: torch.fx.GraphModule | None = None

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, name: str, site: events.Site | None = None) -> CapturedGraph:
        """A graph traced already, keyed by its code."""
        signature = hashlib.sha1(gm.code.encode()).hexdigest()[:20]
        return cls(name, site, signature, len(gm.graph.nodes), lambda: gm)

    @property
    def gm(self) -> torch.fx.GraphModule:
        """The traced graph; what the trace raised (an op with no XLA lowering, ...) is raised at each read."""
        if self._gm is None:
            assert self._trace is not None
            self._gm = self._trace()
            self._trace = None  # the recorded graph the trace read can go
        return self._gm


def trace_for_xla(graph: Any, graph_plan: Any) -> torch.fx.GraphModule:
    """``graph`` as the functional ATen graph the XLA executor would compile, its floats baked in."""
    from tpu_agent.runtime.xla import lowering, tracing

    traced = tracing.trace(graph, graph_plan, graph_plan.floats)
    gm = tracing.with_float_inputs(traced, len(graph_plan.floats))
    missing = sorted({str(node.target) for node in lowering.unsupported_ops(gm)})
    if missing:  # not a stub: the error that leaves the graph out of the estimate, named (_Watcher.trace_graphs)
        raise NotImplementedError(f"no XLA lowering for {', '.join(missing)}")
    return gm
