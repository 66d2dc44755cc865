"""How one op runs on tpu tensors: Strict Eager's dispatcher, and the per-op pieces DeferAndFuse shares with it.

:func:`strict_dispatch` unwraps the arguments (:func:`unwrap_args`: tpu tensors anywhere in nested lists become
their CPU data), runs the op (directly, or through :func:`kernels.run_on_cpu` for MXU rounding, CPU gaps and
device generators) and wraps the results (:func:`rewrap`: an in-place op returns the caller's own tensor). What
the dispatcher does with each overload is decided once per process (:class:`Route`), with the checks some ops
need first (host reads, copies, unsupported ops). In-place layout changes (``unsqueeze_``, ``out=`` results)
restride the wrapper itself (:func:`sync_metadata`, :func:`sync_out_arguments`). DeferAndFuse's recorder and its
CPU executor (:mod:`.deferred`) use the same routes, unwrapping and layout syncs, so an op behaves the same
whether it runs at once or at a flush.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tpu_agent.runtime.emulated import compile_cache, kernels, ops, placement, state, telemetry, unsupported
from tpu_agent.runtime.emulated import tensor as tt
from tpu_agent.runtime.emulated.flush_cause import FlushCause
from tpu_agent.runtime.emulated.tensor import TpuTensor, WrapperTooSmall, unwrap, wrap

_Tensor = torch.Tensor
MIXED_DEVICE_MESSAGE = "Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!"


def _mixed_device(func: Any, t: torch.Tensor) -> None:
    if t.dim() != 0 and not ops.plan_of(func).mixed_device_ok and t.device.type != "meta":
        raise RuntimeError(MIXED_DEVICE_MESSAGE.format(a=tt.DEVICE, b=t.device))


def _unwrap_leaf(func: Any, x: Any) -> Any:
    """One argument with every tpu tensor in it (at any depth of lists and tuples) replaced by its CPU data.

    ATen arguments nest: ``x[:, idx]`` reaches ``aten.index`` as ``[None, idx]``, ``torch.cat`` takes a list,
    foreach ops take lists of lists. A tpu tensor left anywhere inside would send the CPU kernel back into
    the emulator's dispatcher, so every leaf is visited, not just the first item."""
    t = type(x)
    if t is TpuTensor:
        e = x._elem
        return e if e is not None else unwrap(x)
    if t is list or t is tuple:
        for y in x:  # a loop, not all(): sizes, dims and strides reach here on most view ops
            if type(y) not in _PLAIN_SCALARS:
                return t([_unwrap_leaf(func, y) for y in x])
        return x  # sizes, dims, strides: nothing to unwrap
    if isinstance(x, _Tensor):
        if x.device.type == "tpu":
            # Not a TpuTensor yet on the tpu device: a factory's result while Dynamo or AOTAutograd trace
            # (``torch.arange(n, device=x.device)`` makes a fake or functional tensor of the device itself); its
            # counterpart on the data device is what the other operands' data meets (a traced copy, no data).
            return x.to(placement.DATA_DEVICE)
        _mixed_device(func, x)
    return x


_PLAIN_SCALARS = frozenset({int, float, bool, type(None)})


def unwrap_args(func: Any, args: tuple | list) -> list:
    """CPU arguments for ``func``: tpu tensors (anywhere in nested lists and tuples) replaced by their CPU data."""
    out = list(args)
    for i, a in enumerate(args):
        t = type(a)
        if t is TpuTensor:
            e = a._elem
            out[i] = e if e is not None else unwrap(a)
        elif t is list or t is tuple or isinstance(a, _Tensor):
            out[i] = _unwrap_leaf(func, a)
    return out


def unwrap_kwargs(func: Any, kwargs: dict) -> tuple[dict, bool]:
    """CPU keyword arguments, and whether the op writes its result to the host (``device=cpu``)."""
    out = dict(kwargs)
    to_host = False
    for k, v in kwargs.items():
        t = type(v)
        if t is TpuTensor:
            out[k] = v._elem if v._elem is not None else unwrap(v)
        elif k == "device" and v is not None:
            dev = v if t is torch.device else torch.device(v)
            if dev.type == "cpu":
                to_host = True
            else:
                out[k] = placement.DATA_DEVICE
        elif t is list or t is tuple or isinstance(v, _Tensor):
            out[k] = _unwrap_leaf(func, v)
    return out, to_host


def rewrap(out: Any, args: tuple, cargs: list, kwargs: dict, ckwargs: dict, make: Any = None) -> Any:
    """tpu tensors for the op's results; a result that is an input's own CPU (or meta) tensor maps back to that
    input, so in-place and ``out=`` ops return the caller's tensor. ``make`` builds the others (default :func:`wrap`)."""
    t = type(out)
    if t is _Tensor or (t is not TpuTensor and isinstance(out, _Tensor)):
        for i, c in enumerate(cargs):
            if c is out and type(args[i]) is TpuTensor:
                return args[i]
        if kwargs:
            for k, c in ckwargs.items():
                if c is out and type(kwargs[k]) is TpuTensor:
                    return kwargs[k]
        return wrap(out) if make is None else make(out)
    if t is tuple or t is list:
        return t(rewrap(o, args, cargs, kwargs, ckwargs, make) for o in out)
    return out


_PYTHON_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)


def sync_metadata(t: Any, source: torch.Tensor) -> None:
    """After an in-place shape/stride change (``unsqueeze_``, ``t_``, ``resize_``...), restride the tpu
    tensor itself to match ``source`` (its CPU data).

    A wrapper's own storage is a size record, not memory, and cannot grow: when the op grew the data this
    raises :class:`WrapperTooSmall`, which :meth:`TpuTensor.resize_` turns into a rebuilt tensor."""
    if type(t) is not TpuTensor or (
        t.shape == source.shape and t.stride() == source.stride() and t.storage_offset() == source.storage_offset()
    ):
        return
    t._layout = None
    try:
        with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEY):
            torch.ops.aten.as_strided_.default(t, source.shape, source.stride(), source.storage_offset())
        return
    except RuntimeError:
        pass
    raise WrapperTooSmall(
        f"the tpu tensor's data grew to size {tuple(source.shape)}; TpuTensor.resize_ rebuilds the tensor around it"
    )


def sync_out_arguments(
    func: Any, kwargs: dict, data_kwargs: dict, before_relayout: Callable[[], None] | None = None
) -> None:
    """After an ``out=`` op, give each ``out`` tpu tensor the layout the op gave its data (``data_kwargs``: the
    CPU tensors in Strict, the meta tensors when DeferAndFuse records): out variants resize ``out`` to the result's
    shape, and a wrapper left at its old shape reads the wrong elements. When recording, an ``out`` that has data
    takes the new layout at once, so views cut from it before the flush agree; ``before_relayout`` runs first
    (DeferAndFuse materialises the pending ops, which read the old layout).

    A result larger than the tensor's memory cannot grow it from inside the dispatcher (``resize_`` can: it runs
    before it); that is refused with the shape to allocate, and the tensor keeps its old shape and data layout."""
    for name in route_of(func).plan.out_arguments:
        wrappers, data = kwargs.get(name), data_kwargs.get(name)
        if type(wrappers) is TpuTensor:
            wrappers, data = (wrappers,), (data,)
        if not isinstance(wrappers, (tuple, list)) or not isinstance(data, (tuple, list)):
            continue
        for wrapper, source in zip(wrappers, data, strict=True):
            if type(wrapper) is not TpuTensor or not isinstance(source, _Tensor):
                continue
            elem = wrapper._elem
            relayout = elem is not None and elem is not source and _layout(elem) != _layout(source)
            if relayout and before_relayout is not None:
                before_relayout()
                before_relayout = None
            try:
                sync_metadata(wrapper, source)
            except WrapperTooSmall:
                needed = tuple(source.shape)
                source.as_strided_(wrapper.shape, wrapper.stride(), wrapper.storage_offset())
                raise RuntimeError(
                    f"{func}: the out= tensor '{name}' of shape {tuple(wrapper.shape)} is too small for the result "
                    f"of shape {needed}, and a tpu tensor's memory cannot grow inside an op. Allocate it with the "
                    f"result's shape (torch.empty({needed}, device='tpu')), call {name}.resize_({needed}) first, or "
                    "use the op's return value instead of out=."
                ) from None
            if relayout and elem is not None:
                elem.as_strided_(source.shape, source.stride(), source.storage_offset())


def _layout(t: torch.Tensor) -> tuple[torch.Size, tuple[int, ...], int]:
    return t.shape, t.stride(), t.storage_offset()


class Route:
    """What the dispatcher does with one overload, decided once per process: its op plan, the check that must
    run before it (:data:`_SPECIAL`), whether its CPU kernel can be called directly (no MXU rounding, CPU-gap
    computation or device generator to go through :func:`kernels.run_on_cpu`), and the tensor-list arguments
    it writes in place. Read per op instead of the tables."""

    __slots__ = ("func", "plan", "special", "direct", "written_lists", "builds")

    def __init__(self, func: Any) -> None:
        self.func = func
        self.plan = ops.plan_of(func)
        self.special = _SPECIAL.get(id(func))
        self.direct = self.plan.mxu_operands is None and self.plan.gap is None and kernels.draw_of(func) is None
        # whether TorchTPU builds an executable for it in Strict mode (views and host transfers compute nothing)
        self.builds = not (self.plan.is_view or self.plan.transfer or self.plan.metadata_inplace)
        self.written_lists = tuple(
            i
            for i, argument in enumerate(func._schema.arguments)
            if argument.alias_info is not None
            and argument.alias_info.is_write
            and isinstance(argument.type, torch.ListType)
        )


def bump_written_lists(route: Route, args: tuple) -> None:
    """Advance the version counters of the tensors an in-place foreach op wrote (``_foreach_add_``'s list).

    For a single tensor the ADInplaceOrView kernel above this dispatcher does it; for tensor lists it does not
    reach the wrappers (the CPU kernel bumps the CPU data's counters only). Autograd's saved-tensor checks and
    the MXU rounding cache key on these counters, so an optimizer's foreach update must advance them, as it
    does for tensors on a device without the emulation."""
    for i in route.written_lists:
        if i < len(args):
            torch._C._increment_version([t for t in args[i] if type(t) is TpuTensor])


_ROUTES: dict[int, Route] = {}


def route_of(func: Any) -> Route:
    """``func``'s :class:`Route`, keyed by identity (overloads live as long as the process)."""
    route = _ROUTES.get(id(func))
    if route is None or route.func is not func:
        route = _ROUTES[id(func)] = Route(func)
    return route


def strict_dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """Strict Eager's dispatcher: run ``func`` on the CPU data now and wrap its results (Debug Eager: and check
    them). DeferAndFuse runs the ops it cannot defer through it too."""
    route = route_of(func)
    if state.log_enabled:
        telemetry.op_counts[func] += 1
    if route.special is not None:
        route.special(func, args, kwargs)
    if route.builds:
        compile_cache.request_op(func, args, kwargs)
    cargs = unwrap_args(func, args)
    if kwargs:
        ckwargs, to_host = unwrap_kwargs(func, kwargs)
        if to_host:
            return kernels.run_on_cpu(func, cargs, ckwargs, state.effective_precision(), args, route.plan)
    else:
        ckwargs = kwargs
    if route.direct:
        out = route.plan.call(*cargs, **ckwargs)
    else:
        out = kernels.run_on_cpu(func, cargs, ckwargs, state.effective_precision(), args, route.plan)
    if state.debug_checks:
        from tpu_agent.runtime.emulated import debug

        debug.check(func, cargs, ckwargs, out)
    if type(out) is _Tensor:  # the common case: one new tensor, or an in-place op's own argument
        for i, c in enumerate(cargs):
            if c is out and type(args[i]) is TpuTensor:
                result = args[i]
                break
        else:
            result = rewrap(out, args, cargs, kwargs, ckwargs) if kwargs else wrap(out)
    else:
        result = rewrap(out, args, cargs, kwargs, ckwargs)
    if route.plan.metadata_inplace:
        sync_metadata(result, out)
    elif route.plan.out_arguments and kwargs:
        sync_out_arguments(func, kwargs, ckwargs)
    if route.written_lists:
        bump_written_lists(route, args)
    return result


# ---------------------------------------------------------------------- ops that need attention before running


def _host_read_op(func: Any, args: tuple, kwargs: dict) -> None:
    telemetry.host_sync(ops.HOST_READ_OPS[func])


def _copy_op(func: Any, args: tuple, kwargs: dict) -> None:
    dst = args[0]
    if type(dst) is not TpuTensor and isinstance(dst, _Tensor):
        telemetry.host_sync(FlushCause.CPU)
    elif placement.SMALL_DATA_BYTES and dst._elem is not None and not dst._elem.is_meta and _is_data_less(args[1]):
        # capture-only: data-less values copied into a small tensor that had data (a meta parameter moved to the
        # device): its values are unknown from now on, so its data becomes meta too
        elem = dst._elem
        extent = elem.untyped_storage().nbytes() // elem.element_size()
        flat = torch.empty(extent, dtype=elem.dtype, device="meta")
        dst._elem = flat.as_strided(elem.shape, elem.stride(), elem.storage_offset())


def _is_data_less(src: Any) -> bool:
    data = src._elem if type(src) is TpuTensor else src
    return isinstance(data, _Tensor) and data.is_meta


def _to_copy_op(func: Any, args: tuple, kwargs: dict) -> None:
    unsupported.check(func, args, kwargs)
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "cpu":
        telemetry.host_sync(FlushCause.CPU)


# Keyed by id(op): the lookup runs on every op, and an OpOverload hashes in Python (overloads live forever).
_SPECIAL: dict[int, Any] = {id(op): unsupported.check for op in unsupported.CHECKED_OPS}
_SPECIAL.update({id(op): _host_read_op for op in ops.HOST_READ_OPS})
_SPECIAL[id(torch.ops.aten.copy_.default)] = _copy_op
_SPECIAL[id(torch.ops.aten._to_copy.default)] = _to_copy_op
