"""Capture-only mode of ``tpu-agent estimate``: record a script's step graphs without ever computing them.

Users estimate the model they want to train, not one that fits their laptop: a 7B-parameter Llama holds 14 GB of
bf16 parameters before its gradients and optimizer state. In this mode no tensor on the emulated ``tpu`` device
has data: every one holds a *meta* tensor (shape, strides, dtype, no memory), from the factory that creates it
(:func:`placement.place_data_on`) to the graph that produces it. DeferAndFuse already infers each recorded op's
output on meta tensors, so the script runs as usual and its graphs are recorded; at each flush
:class:`CaptureOnlyExecutor` plans the graph as the XLA executor would and hands it to the estimate's observers
(traced to the same functional ATen graph when one first reads it), then gives the graph's outputs meta data
instead of running it. Nothing the size of the model is ever allocated on the host.

What needs values cannot be answered without computing them:

* host reads that only *show* a value (``loss.item()``, ``print(loss)``, ``.cpu()``, ``.tolist()``) get a
  placeholder of zeros, with a one-line warning per source line;
* reads that *decide* something (``if (x > 0).any():``, ``int(n)`` as a size) stop the run with an error naming
  the user's line: a guessed branch would estimate another program;
* ops whose output shape depends on values are *bounded*: ``nonzero`` and ``masked_select`` answer with their
  largest possible output (every element selected), so the estimate is of the costliest such step;
* sizes read on the host and given back to an op (``counts.tolist()`` then ``x.split(counts)``: a MoE layer's
  tokens per expert) come back as placeholder zeros, which no longer sum to the split dimension; a split whose
  sizes were such placeholders is *bounded* to an even split that sums to the dimension (balanced routing);
* initialisers that loop on values (``nn.init.trunc_normal_`` redraws until ``mask.any()`` is false) are skipped:
  initial values never change the step's program.

Each bound and skip is stated in the estimate's assumptions (:attr:`_Reads.assumptions`). A parameter
registered while the mode is on is swapped at once for one of the same shape without data (a ``meta`` tensor, or
a ``tpu`` tensor holding one), so a model built on the host the usual way (``GPT(config).to(device)``) never
allocates its weights either.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.estimate.captured import CapturedGraph, float_shape_key, trace_for_xla
from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import placement
from tpu_agent.runtime.emulated.flush_cause import FlushCause

_META = torch.device("meta")
NEEDS_VALUES = "capture-only-needs-values"
# host reads whose value is only shown or stored: answered with zeros
_PLACEHOLDER_CAUSES = frozenset(
    {
        FlushCause.ITEM,
        FlushCause.TOLIST,
        FlushCause.FLOAT,
        FlushCause.PRINT,
        FlushCause.NUMPY,
        FlushCause.SAVE,
        FlushCause.CPU,
    }
)


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


def _meta_planner(live: set[int]) -> Any:
    """The XLA executor's planner with storages keyed by :func:`storage_identity` and fake CPU input buffers
    (the trace sees the devices the XLA path sees; the buffers hold no memory). Only the ``live`` results are
    outputs, as on the XLA path: a program that returned every intermediate would be estimated holding every
    activation at once (and a checkpointed step no smaller than one without)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from tpu_agent.runtime.xla import arrays, planning

    class MetaPlanner(planning.Planner):
        def __init__(self) -> None:
            super().__init__(live)
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
    """Hands each flushed graph to the observers as a :class:`CapturedGraph` and gives its outputs meta data; runs
    nothing. One graph object per plan and :func:`float_shape_key` of its floats: a later flush of it with other
    step-to-step floats is the same graph, traced (if ever) once."""

    def __init__(self) -> None:
        self.captured: dict[tuple[str, tuple[float | str, ...]], CapturedGraph] = {}

    def run(self, graph: Any, cause: FlushCause) -> None:
        try:
            self._observe(graph)
        finally:  # whatever the plan made of it, the graph's tensors get their (meta) data, as after a run
            _give_meta_data(graph)

    def _observe(self, graph: Any) -> None:
        from tpu_agent.runtime.emulated import liveness, state
        from tpu_agent.runtime.xla import graphs, planning

        name = f"deferred graph {graph.hash}"
        try:
            planner = _meta_planner(liveness.live_results(graph))
            graph_plan = planning.plan(graph, planner)
        except Exception as error:  # noqa: BLE001 - the graph is left out of the estimate and named there
            for report_fallback in graphs.fallback_observers:
                report_fallback(name, len(graph.nodes), error)
            return
        key = (graph_plan.key, tuple(float_shape_key(value) for value in graph_plan.floats))
        captured = self.captured.get(key)
        if captured is None:
            signature = hashlib.sha1(repr(key).encode()).hexdigest()[:20]
            trace = functools.partial(trace_for_xla, graph, graph_plan)
            captured = self.captured[key] = CapturedGraph(name, graph.nodes[0].site, signature, len(graph.nodes), trace)
        runner: Any = captured  # what the observers read of a GraphRunner (gm, name, site, signature)
        for observe in graphs.graph_observers:
            observe(runner, [*planner.meta_buffers, *planner.floats], state.effective_precision())


SMALL_BYTES = 4 << 20  # an op's outputs up to this size are computed for real when all its inputs have data


def _has_data(value: Any) -> bool:
    """Whether every tensor in ``value`` holds real data: a host tensor, or a tpu tensor whose data is not meta."""
    from tpu_agent.runtime.emulated import tensor as tt
    from tpu_agent.runtime.emulated.liveness import tensors_in

    for t in tensors_in(value):
        data = t._elem if type(t) is tt.TpuTensor else t
        if data is None or data.is_meta:
            return False
    return True


def _small_and_real(node: Any) -> bool:
    """A node computed for real: every input has data (the batch as uploaded, index ranges, masks made from them)
    and its outputs are small, so a decision on them (``if mask.all():`` in a library) reads real values."""
    from tpu_agent.runtime.emulated.liveness import tensors_in

    outputs = tensors_in(node.outputs)
    if sum(t.numel() * t.element_size() for t in outputs) > SMALL_BYTES:
        return False
    return _has_data(node.args) and _has_data(list(node.kwargs.values()))


def _give_meta_data(graph: Any) -> None:
    """Every deferred tensor of ``graph`` gets data: real for small ops on real inputs (:func:`_small_and_real`),
    else meta data with the layout its metadata promised; a view's is a view of its base's, so later views and
    in-place ops see one storage, as after a real run."""
    from tpu_agent.runtime.emulated import deferred
    from tpu_agent.runtime.emulated import tensor as tt
    from tpu_agent.runtime.emulated.liveness import tensors_in
    from tpu_agent.runtime.xla import arrays

    cpu = deferred.CpuExecutor()
    for node in graph.nodes:
        if _small_and_real(node):
            try:
                with placement.placed_on(placement.CPU):  # what a device argument (a copy's to="tpu") makes
                    cpu.run(deferred.Graph([node]), FlushCause.CAPTURE_ONLY_SMALL)
                continue
            except Exception:  # noqa: BLE001 - an op that needs more than its inputs: meta data like the rest
                pass
        base = next((t for t in tensors_in(node.args) if type(t) is tt.TpuTensor), None)
        for wrapper in tensors_in(node.outputs):
            if type(wrapper) is not tt.TpuTensor or wrapper._elem is not None:
                continue
            layout = (wrapper.shape, wrapper.stride(), wrapper.storage_offset())
            if node.func.is_view and base is not None and base._elem is not None:
                tt.materialized(wrapper, base._elem.as_strided(*layout))
                continue
            flat = torch.empty(arrays.storage_end(*layout), dtype=wrapper.dtype, device=_META)
            tt.materialized(wrapper, flat.as_strided(*layout))


class ValuesNeeded(TpuAgentError):
    """The script asked for a value that decides what runs next; capture-only mode has no values."""


@dataclass
class _Reads:
    """What the mode answered: lines already warned about, and the first read that stopped the run."""

    warned: set[tuple[str, str]] = field(default_factory=set)
    stopped: ValuesNeeded | None = None
    integer_placeholders: bool = False  # integers were answered with placeholder zeros (sizes may be made of them)
    assumptions: list[str] = field(default_factory=list)  # each value-dependent op bounded or skipped, once a line

    def assume(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)


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
    FlushCause.ITEM: "Tensor.item()",
    FlushCause.TOLIST: "Tensor.tolist()",
    FlushCause.FLOAT: "float(tensor)",
    FlushCause.PRINT: "printing a tensor",
    FlushCause.NUMPY: "Tensor.numpy()",
    FlushCause.SAVE: "saving a tensor",
    FlushCause.CPU: "copying a tensor to the host",
    FlushCause.BOOL: "a branch on a tensor (bool(tensor))",
    FlushCause.INT: "int(tensor) (a size or index from a tensor)",
    FlushCause.DATA_DEPENDENT: "an op whose output shape depends on values",
}


def host_read(t: torch.Tensor, cause: FlushCause) -> torch.Tensor:
    """Answers ``item()``, ``print``, ``bool()``... on a tpu tensor: zeros where the value is only shown,
    :class:`ValuesNeeded` where it would decide what runs."""
    from tpu_agent.runtime.emulated import tensor as tt

    site = _site()
    what = _DESCRIPTIONS.get(cause, cause)
    if cause not in _PLACEHOLDER_CAUSES:
        data = tt.unwrap(t, cause)  # flushes: a value made from real data is computed (_small_and_real)
        if not data.is_meta:
            _decided_on_real_data(what, site)
            return data
        raise _stop(what, site)
    _placeholder_warning(what, site)
    if not t.dtype.is_floating_point and not t.dtype.is_complex:
        reads.integer_placeholders = True
    return torch.zeros(t.shape, dtype=t.dtype)


def _decided_on_real_data(what: str, site: events.Site | None) -> None:
    reads.assume(
        f"{what} at {_where(site)}: answered with its real value, computed on the host from small inputs that "
        "have data (the batch as uploaded, ranges, masks)"
    )


def eager_op(func: Any, args: tuple, kwargs: dict, cause: FlushCause) -> Any:
    """Answers the ops DeferAndFuse would run at once on data (see :func:`deferred._eager`)."""
    from tpu_agent.runtime.emulated import deferred, dispatch
    from tpu_agent.runtime.emulated import tensor as tt

    site = _site()
    if cause == FlushCause.FALLBACK:  # shapes meta inference could not give, or storage changes: run on the meta data
        deferred.flush(cause, site)
        return dispatch.strict_dispatch(func, _even_split_sizes(func, args, kwargs, site), kwargs)
    if cause not in _PLACEHOLDER_CAUSES:
        deferred.flush(cause, site)
        if _has_data(args) and _has_data(list(kwargs.values())):
            _decided_on_real_data(f"{_DESCRIPTIONS.get(cause, cause)} ({func})", site)
            return dispatch.strict_dispatch(func, args, kwargs)
    if cause == FlushCause.DATA_DEPENDENT and func in _BOUNDED:
        shape, dtype = _BOUNDED[func](*args, **kwargs)
        reads.assume(
            f"{func} at {_where(site)}: its output size depends on values; bounded by its largest ({list(shape)}, "
            "every element selected), so the step estimated is the costliest one"
        )
        return tt.wrap(torch.empty(shape, dtype=dtype, device=_META))
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


_SIZED_SPLITS = frozenset({torch.ops.aten.split_with_sizes.default, torch.ops.aten.split_with_sizes_copy.default})


def _even_split_sizes(func: Any, args: tuple, kwargs: dict, site: events.Site | None) -> tuple:
    """``args`` of a sized split whose sizes were placeholders (they do not sum to the split dimension after a
    host read answered integers with zeros) with those sizes replaced by an even split that sums to it; any
    other op's ``args`` as they are (a wrong sum in the script itself fails as it would on the device)."""
    if func not in _SIZED_SPLITS or not reads.integer_placeholders:
        return args
    x, sizes, *rest = args
    dim = rest[0] if rest else kwargs.get("dim", 0)
    total = x.shape[dim]
    if not sizes or sum(sizes) == total:
        return args
    share, extra = divmod(total, len(sizes))
    even = [share + (1 if n < extra else 0) for n in range(len(sizes))]
    reads.assume(
        f"{func} at {_where(site)}: its sizes were read from the device (placeholder zeros here); bounded by an "
        f"even split of {total} into {len(sizes)} parts (balanced routing, every part's work counted)"
    )
    return (x, even, *rest)


def _nonzero_bound(x: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    return (x.numel(), x.dim()), torch.int64


def _masked_select_bound(x: torch.Tensor, mask: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    return (torch.broadcast_shapes(x.shape, mask.shape).numel(),), x.dtype


# data-dependent ops answered with their largest output: (args) -> (shape, dtype)
_BOUNDED: dict[Any, Any] = {
    torch.ops.aten.nonzero.default: _nonzero_bound,
    torch.ops.aten.masked_select.default: _masked_select_bound,
}
# initialisers that read values to decide how often to redraw (torch 2.13's trunc_normal_ loops on mask.any())
_VALUE_LOOP_INITS = ("trunc_normal_",)


def _skipping_init(name: str) -> Any:
    original = getattr(torch.nn.init, name)

    def skipped(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if tensor.is_meta or tensor.device.type != "tpu":
            return original(tensor, *args, **kwargs)
        reads.assume(
            f"torch.nn.init.{name} at {_where(events.user_call_site(2))}: skipped (it loops on the values it draws, "
            "and capture-only computes none; initial values do not change the step's program)"
        )
        return tensor

    return skipped


def data_less(parameter: torch.Tensor) -> torch.Tensor:
    """``parameter`` without data: the same shape, dtype and device kind, a meta tensor behind it (a ``tpu`` one
    holds meta data), so a model built while capture-only is on allocates nothing for its weights."""
    from tpu_agent.runtime.emulated import tensor as tt

    empty = torch.empty_strided(parameter.shape, parameter.stride(), dtype=parameter.dtype, device=_META)
    if parameter.device.type == "tpu":  # meta data even when small: a weight's values are never real here
        empty = tt.wrap(empty)
    swapped = torch.nn.Parameter(empty, requires_grad=parameter.requires_grad)
    setattr(swapped, _REGISTERED, True)
    return swapped


# marks a parameter registered before: registering it again ties it (head.weight = tokens.weight), and a tie to a
# parameter made before the switch must stay a tie, not become a data-less copy (an attribute, not a weak
# reference: Module.to swaps tensors, which torch refuses for a tensor with weak references)
_REGISTERED = "_tpu_agent_registered"


def swap_parameter(module: torch.nn.Module, name: str, parameter: Any) -> Any:
    """Global parameter-registration hook: while capture-only is on, a parameter with data becomes
    :func:`data_less` (None keeps the registered one). Registered once, before the script runs: a hook added
    while torch runs the hooks (the bound switching mid-registration) would change the dict torch iterates."""
    from tpu_agent.runtime.emulated import tensor as tt

    if not isinstance(parameter, torch.Tensor) or getattr(parameter, _REGISTERED, False):
        return None  # registered before (a tied weight: head.weight = tokens.weight): the same object again
    setattr(parameter, _REGISTERED, True)
    if placement.DATA_DEVICE.type != "meta":  # capture-only is off
        return None
    if type(parameter) is torch.nn.Parameter and not parameter.is_meta:  # a host parameter
        return data_less(parameter)
    elem = getattr(parameter, "_elem", None)
    if type(parameter) is tt.TpuTensor and elem is not None and not elem.is_meta:  # a tpu one with data
        return data_less(parameter)
    return None  # already without data, or another subclass (FSDP's DTensor), kept as it is


def install() -> None:
    """Switch this process into capture-only mode for good (the estimate's runtime hook calls it before the
    script runs, or when the host-memory bound says so; the process ends with the capture, so nothing switches
    back). Tensors that already have data keep it; everything made from now on has none."""
    from tpu_agent.runtime.emulated import deferred

    deferred.flush(FlushCause.CAPTURE_ONLY)
    for name in _VALUE_LOOP_INITS:
        setattr(torch.nn.init, name, _skipping_init(name))
    placement.place_data_on(_META, small_bytes=SMALL_BYTES)
    placement.set_host_read(host_read)
    deferred.set_eager_override(eager_op)
    deferred.set_executor(CaptureOnlyExecutor)
