"""DeferAndFuse (Fused Eager): graph capture, kept apart from graph execution.

*Capture* (:func:`record`) turns each op on tpu tensors into a :class:`Node` of the process's pending
:class:`Graph`. Output shapes come from running the op on meta tensors, so the returned tpu tensors have the
right metadata but no data yet (TorchTPU's "Deferred" promise state). *Execution* is a separate
:class:`Executor` object that receives a finished graph; today's :class:`CpuExecutor` runs the nodes in order
on the CPU (TorchTPU's "Materialized" state); :mod:`tpu_agent.runtime.xla.executor` compiles the same graph
objects with XLA.

A flush runs the whole pending graph, at TorchTPU's triggers (reference §2.4; each a :class:`FlushCause`): host
reads, collectives (functional collectives then run at once), synchronize, compiled calls, a graph size limit,
ops whose output shape depends on data, and process exit. Errors in recorded ops therefore surface at the flush,
naming the op and the user line that recorded it.

Why this module is long: :func:`record` is the per-op hot path, and the decisions it takes for each op (run now,
infer on meta, answer through the eager override, cut the graph) read this module's globals directly; spread over
modules they would cost attribute lookups per op, which DeferAndFuse must keep below what Strict pays.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import compile_cache, cpu_gaps, dispatch, kernels, ops, shape_cache, state, telemetry
from tpu_agent.runtime.emulated import tensor as tt
from tpu_agent.runtime.emulated.flush_cause import FlushCause

MAX_GRAPH_OPS = 20_000  # beyond this the graph is flushed with cause FlushCause.SIZE_LIMIT
_META = torch.device("meta")
_modes_active = torch._C._len_torch_dispatch_stack  # how many dispatch modes are on: one C call, 0 when eager


class Node:
    """One recorded op: its ATen overload, arguments (tpu tensors by reference) and the tpu tensors it returned.
    ``versions``: for an MXU op, its operands' base version counters when it was recorded (the rounding cache
    of :mod:`mxu` keys on them), else ``None``. ``inferred``: the shape cache's entry for the call (one object per
    op, layouts of the tensor arguments and values of the others), or ``None`` when the call was not cacheable:
    a compiling executor recognises a graph it planned before by these objects instead of re-reading every node.

    A slotted class rather than a dataclass: one is made per recorded op, on DeferAndFuse's hot path."""

    __slots__ = ("func", "args", "kwargs", "outputs", "precision", "site", "signature", "versions", "inferred")

    def __init__(
        self,
        func: Any,
        args: tuple,
        kwargs: dict,
        outputs: Any,
        precision: state.Precision,
        site: events.Site | None,
        signature: str,
        versions: tuple | None = None,
        inferred: shape_cache.Inferred | None = None,
    ) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.outputs = outputs
        self.precision = precision
        self.site = site
        self.signature = signature
        self.versions = versions
        self.inferred = inferred

    def __repr__(self) -> str:
        return f"Node({self.signature})"


@dataclass
class Graph:
    """The pending op sequence; ``hash`` is stable for the same step code and shapes.

    ``storages`` keys the CPU storages of the materialised tensors the nodes read or write (in-place and
    ``out=`` ops write into their argument's existing data). Such a tensor has data (``_elem``) that the flush
    will still change, or that a node has yet to read, so anything that reads or writes that data directly must
    flush first (see :func:`touches`)."""

    nodes: list[Node] = field(default_factory=list)
    storages: set[int] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.nodes)

    @functools.cached_property
    def hash(self) -> str:
        """Read once the graph is complete (at its flush): computed once, for the flush record and the executor."""
        text = "".join([node.signature + ";" for node in self.nodes])
        return hashlib.sha1(text.encode()).hexdigest()[:16]


class Executor(Protocol):
    """Runs a flushed graph: gives each of its deferred tensors data, or raises naming the op. :class:`CpuExecutor`
    unless one is installed with :func:`set_executor` (the XLA executor, estimate's capture-only one)."""

    def run(self, graph: Graph, cause: FlushCause) -> None: ...


EagerOverride = Callable[[Any, tuple, dict, FlushCause], Any]  # (func, args, kwargs, why): see set_eager_override


class DeferredExecutionError(RuntimeError):
    """An op recorded under DeferAndFuse failed when its graph was materialised."""


class CpuExecutor:
    """Runs a captured graph node by node on the CPU, with the same op semantics as Strict mode."""

    def run(self, graph: Graph, cause: FlushCause) -> None:
        compile_cache.request(("deferred graph", graph.hash))  # op by op: nothing to compile
        for node in graph.nodes:
            func = node.func
            try:
                cargs = dispatch.unwrap_args(func, node.args)
                ckwargs = dispatch.unwrap_kwargs(func, node.kwargs)[0] if node.kwargs else node.kwargs
                route = dispatch.route_of(func)
                if route.direct:
                    out = route.plan.call(*cargs, **ckwargs)
                else:  # the rounding cache keys on the version counters recording saw, not today's
                    versions = node.versions
                    args = node.args if versions is not None else None
                    out = kernels.run_on_cpu(func, cargs, ckwargs, node.precision, args, route.plan, versions)
            except Exception as error:
                where = f" recorded at {node.site}" if node.site else ""
                raise DeferredExecutionError(
                    f"{kernels.device_error(func, error)}\n  [DeferAndFuse] op {func}{where} failed when the pending graph was materialised by '{cause}'"
                ) from error
            outputs = node.outputs
            if type(outputs) is tt.TpuTensor and type(out) is torch.Tensor:  # the common case, inlined
                if outputs._elem is None:
                    tt.materialized(
                        outputs, out if out.stride() == outputs.stride() else _in_recorded_layout(outputs, out)
                    )
            else:
                _fill(outputs, out)


def _fill(wrapped: Any, out: Any) -> None:
    if type(wrapped) is tt.TpuTensor:
        if wrapped._elem is None and isinstance(out, torch.Tensor):
            tt.materialized(wrapped, _in_recorded_layout(wrapped, out))
    elif isinstance(wrapped, (list, tuple)) and isinstance(out, (list, tuple)):
        for w, o in zip(wrapped, out, strict=False):
            _fill(w, o)


def _in_recorded_layout(wrapped: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` with the strides recording gave ``wrapped`` (meta's), so later recorded views of it stay valid.

    Some CPU kernels choose another layout than their meta function (an output contiguous on meta comes back
    transposed on CPU); a ``view`` recorded against meta's strides would then fail at the flush ("view size is
    not compatible with input tensor's size and stride"). A fresh (non-view) result is copied into the recorded
    layout; a view keeps its input's aliasing, and its input already has the recorded layout.
    """
    if out.stride() == wrapped.stride() or out._is_view() or out.shape != wrapped.shape or out.numel() <= 1:
        return out
    try:
        return torch.empty_strided(out.shape, wrapped.stride(), dtype=out.dtype).copy_(out)
    except RuntimeError:  # recorded strides that overlap (stride 0) cannot be written: keep the kernel's layout
        return out


executor_factory: Callable[[], Executor] = CpuExecutor  # the compiler stack and estimate hand theirs in
executor: Executor | None = None  # made by executor_factory at the first flush


def set_executor(factory: Callable[[], Executor]) -> None:
    """Graphs flushed from now on run on an executor ``factory`` makes (at the next flush, once)."""
    global executor, executor_factory
    executor_factory = factory
    executor = None


def _select_executor() -> Executor:
    global executor
    executor = executor_factory()
    return executor


_pending = Graph()
_lock = threading.RLock()
# Called with each graph flushed, before it runs (``tpu-agent estimate`` counts a step's ops, compiled or not)
flush_observers: list[Callable[[Graph], None]] = []


def flush(cause: FlushCause, site: events.Site | None = None) -> None:
    """Execute the pending graph (no-op when empty) and log a Flush record with ``cause``."""
    global _pending, _last_site
    with _lock:
        graph = _pending
        if not graph.nodes:
            return
        _pending = Graph()
        _last_site = (None, None)
        graph_hash = graph.hash
        for observe in flush_observers:
            observe(graph)
        start = time.perf_counter_ns()
        try:
            # The program's ops were recorded as they were issued; their execution here is the emulator's.
            with tt.hidden_from_profiler():
                (executor or _select_executor()).run(graph, cause)
        finally:
            if state.log_enabled:
                events.emit(
                    events.Flush,
                    cause=cause,
                    graph_ops=len(graph),
                    graph_hash=graph_hash,
                    duration_ns=time.perf_counter_ns() - start,
                    site=site if site is not None else events.user_call_site(2),
                )
                telemetry.emit_op_batch()


# ------------------------------------------------------------------------------------------------ capture


def _meta_of(x: Any) -> Any:
    t = type(x)
    if t is tt.TpuTensor:
        m = x.__dict__.get("_meta")
        if m is None:
            m = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_META)
            if x.storage_offset():
                m = m.as_strided(x.shape, x.stride(), x.storage_offset())
            if x.is_conj():
                torch._C._set_conj(m, True)
            if x.is_neg():
                torch._C._set_neg(m, True)
            x._meta = m
        return m
    if t is list or t is tuple:
        return t(_meta_of(y) for y in x)
    if isinstance(x, torch.Tensor):
        return x.to(_META)
    if t is torch.device and x.type == "tpu":
        return _META
    return x


def storage_key(elem: torch.Tensor) -> int:
    """Identifies the CPU storage behind ``elem`` (views share their base's key)."""
    return elem.untyped_storage().data_ptr()


def _add_storages(x: Any, storages: set[int]) -> None:
    t = type(x)
    if t is tt.TpuTensor:
        elem = x._elem
        if type(elem) is torch.Tensor:
            storages.add(storage_key(elem))
    elif t is list or t is tuple:
        for y in x:
            if type(y) is not int:  # sizes and dims hold no storage
                _add_storages(y, storages)


def touches(elem: torch.Tensor) -> bool:
    """Whether the pending graph reads or writes the storage of materialised data ``elem``: then its values
    are not final (a pending in-place op) or still needed as they are (a pending reader)."""
    storages = _pending.storages
    return bool(storages) and type(elem) is torch.Tensor and storage_key(elem) in storages


def _snapshot_host(x: Any) -> Any:
    """Host tensors an op reads are captured at record time, so later host-side writes cannot leak in
    (0-dim ones too: ``b = a * s; s += 1`` and uploads of a host scalar tensor must see ``s`` as it was)."""
    return x.clone() if type(x) is torch.Tensor else x


def _signature(func: Any, margs: Any) -> str:
    shapes = [f"{tuple(a.shape)}{str(a.dtype)[6:]}" for a in margs if isinstance(a, torch.Tensor)]
    return f"{func}({','.join(shapes)})"


eager_override: EagerOverride | None = None


def set_eager_override(answer: EagerOverride | None) -> None:
    """Ops that need their data now are answered by ``answer`` from now on (``None``: flushed and run): how
    estimate's capture-only mode (:mod:`tpu_agent.estimate.capture_only`) answers them without data."""
    global eager_override
    eager_override = answer


def _eager(func: Any, args: tuple, kwargs: dict, cause: FlushCause) -> Any:
    if eager_override is not None:
        return eager_override(func, args, kwargs, cause)
    flush(cause, events.user_call_site(3) if state.log_enabled else None)
    return dispatch.strict_dispatch(func, args, kwargs)


def _is_host_transfer(func: Any, args: tuple, kwargs: dict) -> bool:
    if func is torch.ops.aten._to_copy.default:
        return kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cpu"
    if func is torch.ops.aten.copy_.default:
        return type(args[0]) is not tt.TpuTensor
    return False


def _all_materialized(args: tuple) -> bool:
    """A view of materialised tensors is pure metadata: it runs at once, so it aliases its base's data
    immediately (and survives ``Module.to``'s parameter swap, which re-homes tensor objects)."""
    for a in args:
        if type(a) is tt.TpuTensor and a._elem is None:
            return False
    return True


def _is_host_upload(func: Any, args: tuple) -> bool:
    """``cpu_tensor.to("tpu")``: TorchTPU copies host to device at once (reference §2.3), so the copy into an
    already-allocated tpu tensor runs now instead of joining the graph, unless pending nodes still read or
    write that tensor: then the copy joins the graph, after them, as in program order."""
    return (
        func is torch.ops.aten.copy_.default
        and type(args[0]) is tt.TpuTensor
        and args[0]._elem is not None
        and type(args[1]) is not tt.TpuTensor
        and not touches(args[0]._elem)
    )


def _infer(
    func: Any, args: tuple, kwargs: dict, key: tuple | None
) -> tuple[Any, str, shape_cache.Inferred | None] | None:
    """Run ``func`` on meta tensors: its deferred outputs, graph signature and the shape cache entry it made
    (``None``: not cacheable); ``None`` when the shapes are unknown."""
    margs = [_meta_of(a) for a in args]
    mkwargs = {k: _meta_of(v) for k, v in kwargs.items()} if kwargs else kwargs
    if mkwargs and "device" in mkwargs and mkwargs["device"] is not None:
        mkwargs["device"] = _META
    try:
        mout = cpu_gaps.compute(ops.plan_of(func).gap, func, margs, mkwargs)  # shapes as the device accepts them
    except Exception:  # noqa: BLE001 - any op whose shapes cannot be inferred runs eagerly (with an event)
        return None
    outputs = dispatch.rewrap(mout, args, margs, kwargs, mkwargs, make=tt.wrap_pending)
    if func in ops.METADATA_INPLACE_OPS:
        dispatch.sync_metadata(outputs, mout)
    elif mkwargs and dispatch.route_of(func).plan.out_arguments:
        dispatch.sync_out_arguments(func, kwargs, mkwargs, before_relayout=lambda: flush(FlushCause.LAYOUT_CHANGE))
    signature = _signature(func, margs)
    inferred = None
    if key is not None:
        inferred = shape_cache.describe(mout, margs, mkwargs, args, kwargs, signature)
        if inferred is not None:
            shape_cache.store(key, inferred)
    return outputs, signature, inferred


# The site of the last op recorded from a library frame: (that frame, its user site). While the same frame
# object is on the stack its callers are suspended where they called it, so every op it issues has the same user
# site; the stack walk then runs once per library frame instead of once per op (backward issues all its ops from
# one frame). Holding the frame keeps it from being reused for another call; flush releases it.
_last_site: tuple[Any, events.Site | None] = (None, None)
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


# Sites of user frames, per (code object, line): ops issued from the user's own code (a model defined in the
# training script) get the frame's line without a stack walk or a new Site per op. Bounded like the shape cache.
_user_sites: dict[tuple[Any, int], events.Site] = {}
_library_code: dict[Any, bool] = {}
MAX_SITES = 4096


def _recording_site() -> events.Site | None:
    """The user line that issued the op :func:`record` is recording (called by record only: fixed depth)."""
    global _last_site
    try:
        frame = sys._getframe(3)  # 0: here, 1: record, 2: TpuTensor.__torch_dispatch__, 3: the op's caller
    except ValueError:  # record called from the top of a stack
        return None
    cached_frame, site = _last_site
    if frame is cached_frame:
        return site
    code = frame.f_code
    library = _library_code.get(code)
    if library is None:
        if len(_library_code) >= MAX_SITES:
            _library_code.clear()
        library = _library_code[code] = events.is_library_file(code.co_filename)
    if not library:  # the caller is the user's line (what user_call_site would find first)
        line = frame.f_lineno
        site = _user_sites.get((code, line))
        if site is None:
            if len(_user_sites) >= MAX_SITES:
                _user_sites.clear()
            site = _user_sites[(code, line)] = events.Site(file=code.co_filename, line=line, function=code.co_name)
        return site
    site = events.user_call_site(4)
    # a generator's frame is resumed from other callers: its site can change while the frame lives
    if not code.co_flags & _RESUMABLE:
        _last_site = (frame, site)
    return site


_HIGHEST = state.Precision.HIGHEST


def _operand_versions(positions: tuple[int, ...], args: tuple) -> tuple:
    """The version counters of the MXU operands' bases now, parallel to ``positions`` (``None``: no tpu tensor)."""
    versions = []
    for p in positions:
        a = args[p] if p < len(args) else None
        if type(a) is tt.TpuTensor:
            base = a._base
            versions.append((base if base is not None else a)._version)
        else:
            versions.append(None)
    return tuple(versions)


def record(func: Any, args: tuple, kwargs: dict) -> Any:
    """The DeferAndFuse dispatcher: append ``func`` to the pending graph and return deferred tpu tensors.

    The hot path of DeferAndFuse: with the op's signature in the shape cache, recording costs a key, a lookup,
    the output wrappers and a :class:`Node`, and must stay below what Strict pays to run the op. An op torch
    traces runs as Strict runs it, on the trace's own tensors (see :func:`tensor.torch_is_tracing`)."""
    if _modes_active() and tt.torch_is_tracing():
        return dispatch.strict_dispatch(func, args, kwargs)
    route = dispatch.route_of(func)
    plan = route.plan
    if not plan.plain_record:  # a transfer, view, host read or data-dependent op may have to run now
        if plan.host_read is not None or (plan.transfer and _is_host_transfer(func, args, kwargs)):
            return _eager(func, args, kwargs, plan.host_read or FlushCause.CPU)
        if (plan.transfer and _is_host_upload(func, args)) or (plan.is_view and _all_materialized(args)):
            try:
                return dispatch.strict_dispatch(func, args, kwargs)
            except RuntimeError:  # a view its data refuses (capture-only's placeholder sizes): the override answers
                if eager_override is None or not plan.is_view:
                    raise
                return eager_override(func, args, kwargs, FlushCause.FALLBACK)
        if plan.data_dependent:
            return _eager(func, args, kwargs, FlushCause.DATA_DEPENDENT)
        if plan.collective:
            return _eager(func, args, kwargs, FlushCause.COLLECTIVE)
        if plan.storage_changing:  # the tensor object or its memory changes: needs its data now
            telemetry.emit_fallback(str(func))
            return _eager(func, args, kwargs, FlushCause.FALLBACK)
    if route.special is not None:
        route.special(func, args, kwargs)
    # ops that change a tensor's layout in place are inferred every time: the cache describes new outputs only
    key = shape_cache.key_of(func, args, kwargs) if not (plan.metadata_inplace or plan.out_arguments) else None
    inferred = shape_cache.lookup(key) if key is not None else None
    if inferred is not None:
        description = inferred.outputs
        if description[0] == "new":  # the common case: one new tensor
            outputs = tt.wrap_pending_layout(description[1])
        else:
            outputs = shape_cache.build(description, args, kwargs)
        signature = inferred.signature
    else:
        inferred_now = _infer(func, args, kwargs, key)
        if inferred_now is None:
            telemetry.emit_fallback(str(func))
            return _eager(func, args, kwargs, FlushCause.FALLBACK)
        outputs, signature, inferred = inferred_now
    if state.log_enabled:
        telemetry.op_counts[func] += 1
    stack = state.precision_stack
    precision = stack[-1] if stack else state.precision
    if not route.direct and (draw := kernels.draw_of(func)) is not None and draw.generator_at is not None:
        args, kwargs = draw.pinned(args, kwargs)
    with _lock:
        host = False
        storages = _pending.storages
        for a in args:  # one pass: the storages the node reads or writes, and whether it reads host tensors
            t = type(a)
            if t is tt.TpuTensor:
                elem = a._elem
                if type(elem) is torch.Tensor:
                    storages.add(elem.untyped_storage().data_ptr())  # storage_key, inlined
            elif t is list or t is tuple:
                _add_storages(a, storages)
            elif t is torch.Tensor:
                host = True
        if kwargs:
            _add_storages(tuple(kwargs.values()), storages)
        nodes = _pending.nodes
        nodes.append(
            Node(
                func,
                tuple([_snapshot_host(x) for x in args]) if host else args,
                {k: _snapshot_host(v) for k, v in kwargs.items()} if kwargs else kwargs,
                outputs,
                precision,
                _recording_site(),
                signature,
                _operand_versions(plan.mxu_operands, args) if plan.mxu_operands and precision is not _HIGHEST else None,
                inferred,
            )
        )
        full = len(nodes) >= MAX_GRAPH_OPS
    if route.written_lists:
        dispatch.bump_written_lists(route, args)
    if full:
        flush(FlushCause.SIZE_LIMIT)
    return outputs
