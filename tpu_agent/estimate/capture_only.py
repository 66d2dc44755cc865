"""Capture-only mode of ``tpu-agent estimate``: record a script's step graphs without ever computing them.

Users estimate the model they want to train, not one that fits their laptop: a 7B-parameter Llama holds 14 GB of
bf16 parameters before its gradients and optimizer state. In this mode no tensor on the emulated ``tpu`` device
has data: every one holds a *meta* tensor (shape, strides, dtype, no memory), from the factory that creates it
(:data:`tensor.DATA_DEVICE`) to the graph that produces it. DeferAndFuse already infers each recorded op's
output on meta tensors, so the script runs as usual and its graphs are recorded; at each flush
:class:`CaptureOnlyExecutor` traces the graph exactly as the XLA executor would (same plan, same functional
ATen graph) and hands it to the estimate's observers, then gives the graph's outputs meta data instead of
running it. Nothing the size of the model is ever allocated on the host.

What needs values cannot be answered without computing them:

* host reads that only *show* a value (``loss.item()``, ``print(loss)``, ``.cpu()``, ``.tolist()``) get a
  placeholder of zeros, with a one-line warning per source line;
* reads that *decide* something (``if (x > 0).any():``, ``int(n)`` as a size, ``torch.nonzero``'s data-dependent
  shape) stop the run with an error naming the user's line: a guessed branch would estimate another program.

The model must be created on the device (``with torch.device("tpu"):``) or on ``meta`` and moved with
``to_empty``: a model built on the host is allocated on the host before this mode can see it.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.runtime import events

_META = torch.device("meta")
NEEDS_VALUES = "capture-only-needs-values"
# host reads whose value is only shown or stored: answered with zeros
_PLACEHOLDER_CAUSES = frozenset({"item", "tolist", "float", "print", "numpy", "save", "cpu"})


def storage_identity(t: torch.Tensor) -> int | None:
    """A key for the storage behind ``t`` (a tpu tensor's data, or a plain tensor), equal for all its views.

    Real storages are told apart by address; meta storages have none (every one is at 0), so their storage
    object's own identity serves, which views and ``set_`` share."""
    local = getattr(t, "_local_tensor", t)  # a DTensor's (FSDP2's sharded parameter's) own shard
    data = getattr(local, "_elem", local)  # a tpu tensor's data; graph inputs already are plain tensors
    if not isinstance(data, torch.Tensor):
        return None
    try:
        storage = data.untyped_storage()
        return storage._cdata if data.device.type == "meta" else storage.data_ptr()
    except (RuntimeError, NotImplementedError):  # storage-less tensors (subclasses without one)
        return None


@dataclass
class CapturedGraph:
    """A traced DeferAndFuse graph as the estimate's observers see a graph runner: its FX graph, name, key."""

    gm: torch.fx.GraphModule
    name: str
    site: events.Site | None
    signature: str = field(init=False)

    def __post_init__(self) -> None:
        self.signature = hashlib.sha1(self.gm.code.encode()).hexdigest()[:20]


def _meta_planner() -> Any:
    """The XLA executor's planner with storages keyed by :func:`storage_identity` and fake CPU input buffers
    (the trace sees the devices the XLA path sees; the buffers hold no memory)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from tpu_agent.runtime.xla import arrays, planning

    class MetaPlanner(planning.Planner):
        def __init__(self) -> None:
            super().__init__()
            self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
            self.by_storage_and_dtype: dict[tuple[int | None, torch.dtype], int] = {}
            self.meta_buffers: list[torch.Tensor] = []  # what the observers get: storages shared with the tensors

        def _buffer_index(self, elem: torch.Tensor) -> int:
            # one buffer per storage and dtype: FSDP2 views its all-gather buffers as several dtypes; with no
            # values to keep consistent, each view type is an input of its own
            storage = (storage_identity(elem), elem.dtype)
            index = self.by_storage_and_dtype.get(storage)
            if index is None:
                index = self.by_storage_and_dtype[storage] = len(self.buffers)
                flat = arrays.flat_storage(elem)
                self.meta_buffers.append(flat)
                # a storage of its own: a fake tensor marks its storage as fake, and this one is the tensor's
                meta = torch.empty(flat.shape, dtype=flat.dtype, device=_META)
                self.buffers.append(FakeTensor(self.fake_mode, meta, torch.device("cpu")))
                self.parts.append(f"B{index}:{elem.dtype}")
            return index

        def cut(self, index: int, low: int, high: int) -> None:
            super().cut(index, low, high)
            self.meta_buffers[index] = planning.window(self.meta_buffers[index], low, high)

    return MetaPlanner()


class CaptureOnlyExecutor:
    """Traces each flushed graph for the observers and gives its outputs meta data; runs nothing."""

    def __init__(self) -> None:
        self.traced: dict[tuple[str, tuple[float, ...]], CapturedGraph | None] = {}

    def run(self, graph: Any, cause: str) -> None:
        try:
            self._observe(graph)
        finally:  # whatever the trace made of it, the graph's tensors get their (meta) data, as after a run
            _give_meta_data(graph)

    def _observe(self, graph: Any) -> None:
        from tpu_agent.runtime.emulated import state
        from tpu_agent.runtime.xla import graphs, lowering, planning, tracing

        name = f"deferred graph {graph.hash}"
        try:
            planner = _meta_planner()
            graph_plan = planning.plan(graph, planner)
            key = (graph_plan.key, tuple(graph_plan.floats))
            if key not in self.traced:
                self.traced[key] = None
                traced = tracing.trace(graph, graph_plan, graph_plan.floats)
                gm = tracing.with_float_inputs(traced, len(graph_plan.floats))
                missing = sorted({str(node.target) for node in lowering.unsupported_ops(gm)})
                if missing:
                    raise NotImplementedError(f"no XLA lowering for {', '.join(missing)}")
                self.traced[key] = CapturedGraph(gm, name, graph.nodes[0].site)
        except Exception as error:  # noqa: BLE001 - the graph is left out of the estimate and named there
            for report_fallback in graphs.fallback_observers:
                report_fallback(name, f"{name} ({len(graph.nodes)} ops)", error)
            return
        # what the observers read of a GraphRunner (gm, name, site, signature), without one that could run it
        captured: Any = self.traced[key]
        if captured is not None:
            for observe in graphs.graph_observers:
                observe(captured, [*planner.meta_buffers, *planner.floats], state.effective_precision())


def _give_meta_data(graph: Any) -> None:
    """Every deferred tensor of ``graph`` gets meta data with the layout its metadata promised; a view's is a view
    of its base's, so later views and in-place ops see one storage, as after a real run."""
    from tpu_agent.runtime.emulated import tensor as tt
    from tpu_agent.runtime.emulated.liveness import tensors_in

    for node in graph.nodes:
        base = next((t for t in tensors_in(node.args) if type(t) is tt.TpuTensor), None)
        for wrapper in tensors_in(node.outputs):
            if type(wrapper) is not tt.TpuTensor or wrapper._elem is not None:
                continue
            layout = (wrapper.shape, wrapper.stride(), wrapper.storage_offset())
            if node.func.is_view and base is not None and base._elem is not None:
                tt.materialized(wrapper, base._elem.as_strided(*layout))
                continue
            spans = [(n - 1) * s for n, s in zip(wrapper.shape, wrapper.stride(), strict=True)]
            extent = wrapper.storage_offset() + sum(spans) + 1 if wrapper.numel() else 0
            flat = torch.empty(extent, dtype=wrapper.dtype, device=_META)
            tt.materialized(wrapper, flat.as_strided(*layout))


class ValuesNeeded(TpuAgentError):
    """The script asked for a value that decides what runs next; capture-only mode has no values."""


@dataclass
class _Reads:
    """What the mode answered: lines already warned about, and the first read that stopped the run."""

    warned: set[tuple[str, str]] = field(default_factory=set)
    stopped: ValuesNeeded | None = None


reads = _Reads()


def _site() -> events.Site | None:
    return events.user_call_site(3)


def _where(site: events.Site | None) -> str:
    return f"{site.file}:{site.line}" if site is not None else "an unknown line"


def _placeholder_warning(what: str, site: events.Site | None) -> None:
    key = (what, _where(site))
    if key in reads.warned:
        return
    reads.warned.add(key)
    print(
        f"tpu-agent estimate: capture-only: {what} at {_where(site)} returns zeros (values are not computed)",
        file=sys.stderr,
    )


def _stop(what: str, site: events.Site | None) -> ValuesNeeded:
    error = ValuesNeeded(
        NEEDS_VALUES,
        f"{_where(site)}: {what} needs a tensor's value, and capture-only mode computes no values (the step's "
        "graphs are recorded from shapes only)",
        "move the decision off the device values (a fixed number of steps, a static shape), or estimate without "
        "--capture-only on a configuration that fits this machine",
        ExitCode.FINDINGS,
    )
    reads.stopped = reads.stopped or error
    return error


_DESCRIPTIONS = {
    "item": "Tensor.item()",
    "tolist": "Tensor.tolist()",
    "float": "float(tensor)",
    "print": "printing a tensor",
    "numpy": "Tensor.numpy()",
    "save": "saving a tensor",
    "cpu": "copying a tensor to the host",
    "bool": "a branch on a tensor (bool(tensor))",
    "int": "int(tensor) (a size or index from a tensor)",
    "data_dependent": "an op whose output shape depends on values",
}


def host_read(t: torch.Tensor, cause: str) -> torch.Tensor:
    """Answers ``item()``, ``print``, ``bool()``... on a tpu tensor: zeros where the value is only shown,
    :class:`ValuesNeeded` where it would decide what runs."""
    site = _site()
    what = _DESCRIPTIONS.get(cause, cause)
    if cause not in _PLACEHOLDER_CAUSES:
        raise _stop(what, site)
    _placeholder_warning(what, site)
    return torch.zeros(t.shape, dtype=t.dtype)


def eager_op(func: Any, args: tuple, kwargs: dict, cause: str) -> Any:
    """Answers the ops DeferAndFuse would run at once on data (see :func:`deferred._eager`)."""
    from tpu_agent.runtime.emulated import deferred
    from tpu_agent.runtime.emulated import tensor as tt

    site = _site()
    if cause == "fallback":  # shapes meta inference could not give, or storage changes: run on the meta data
        deferred.flush(cause, site)
        return tt.strict_dispatch(func, args, kwargs)
    what = f"{_DESCRIPTIONS.get(cause, cause)} ({func})"
    if cause not in _PLACEHOLDER_CAUSES:
        raise _stop(what, site)
    _placeholder_warning(what, site)
    source = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if func is torch.ops.aten._local_scalar_dense.default and source is not None:
        return torch.zeros((), dtype=source.dtype).item()
    if func is torch.ops.aten.copy_.default:
        return args[0]  # a host tensor written from the device: left as it was
    if func is torch.ops.aten._to_copy.default and source is not None:
        return torch.zeros(source.shape, dtype=kwargs.get("dtype") or source.dtype)
    raise _stop(what, site)


def install() -> None:
    """Switch this process into capture-only mode for good (the estimate's runtime hook calls it before the
    script runs; the process ends with the capture, so nothing switches back)."""
    from tpu_agent.runtime.emulated import deferred
    from tpu_agent.runtime.emulated import tensor as tt

    deferred.flush("capture_only")
    tt.DATA_DEVICE = _META
    tt.host_read_override = host_read
    deferred.eager_override = eager_op
    deferred.executor_factory = CaptureOnlyExecutor
    deferred.executor = CaptureOnlyExecutor()
