"""The emulated ``tpu`` tensor: a PrivateUse1 wrapper subclass whose data lives in a CPU tensor.

Every ATen op on a tpu tensor reaches :meth:`TpuTensor.__torch_dispatch__` below autograd, so autograd,
optimizers and ``nn`` modules work unchanged. The dispatcher then follows the eager mode:

* Strict (DEFER_NEVER): unwrap, run the op on the CPU, wrap the results. This is the hot path, kept to a few
  dictionary lookups per op so that training costs little more than on plain CPU.
* Debug (DEFER_NEVER_AND_LAUNCH_BLOCKING): the same, then check the outputs (NaN/Inf introduced by the op) and
  name the op and the user's line.
* DeferAndFuse: record the op into the pending graph of :mod:`deferred` and run the graph at a flush.

While ``torch.profiler`` records, the profile shows the ops the program dispatched to the device, as on a TPU
host: the emulator's own CPU kernels, MXU rounding and bookkeeping beneath each op are hidden from it.

Views keep TorchTPU's aliasing: a view op returns a tpu tensor over a CPU view of the base's CPU tensor, so an
in-place write through the view is visible in the base.

Why this module is long: it holds the tensor subclass and the dispatch entry every op passes through.
Wrapping, unwrapping, materialisation and the dispatch share the class's private state and are on the hot
path of every op, so they stay together (MXU rounding, kernels and the recorder live in their own modules).
In-place layout changes (``resize_``/``set_`` growth, ``out=`` results, ``unsqueeze_``) are here too: they
restride the wrapper itself or swap its internals, which only this class's own state allows.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, SupportsIndex

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.autograd import profiler as _profiler

from tpu_agent.runtime.emulated import (
    compile_cache,
    kernels,
    memory,
    mxu,
    ops,
    state,
    telemetry,
    unsupported,
)

_EMPTY: dict[str, Any] = {}
_Tensor = torch.Tensor
_make_wrapper = torch.Tensor._make_wrapper_subclass
_CPU = torch.device("cpu")
DEVICE: torch.device | None = None  # torch.device("tpu", 0), set by device.register()
MIXED_DEVICE_MESSAGE = "Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!"
# Where new tpu tensors keep their data, and who answers host reads instead of the data: the CPU and nobody, except
# in estimate's capture-only mode (tpu_agent.estimate.capture_only), where data is meta and reads get placeholders.
DATA_DEVICE = _CPU
host_read_override: Callable[[torch.Tensor, str], torch.Tensor] | None = None
# capture-only again: new tpu tensors up to this many bytes still get CPU data (0: all get DATA_DEVICE's), so a
# small batch and the masks made from it hold real values that a library's branch (``if mask.all():``) can read
SMALL_DATA_BYTES = 0


def data_device_for(numel: int, dtype: torch.dtype | None) -> torch.device:
    """Where a new tpu tensor of ``numel`` elements keeps its data (see :data:`SMALL_DATA_BYTES`)."""
    if SMALL_DATA_BYTES and numel * (dtype or torch.get_default_dtype()).itemsize <= SMALL_DATA_BYTES:
        return _CPU
    return DATA_DEVICE


class TpuTensor(torch.Tensor):
    """A tensor on the emulated ``tpu:0`` device; ``_elem`` is its CPU data (``None`` while deferred)."""

    # None by default: a deferred tensor is born without data, and setting the attribute on each new wrapper
    # costs DeferAndFuse's recording a measurable share of an op
    _elem: torch.Tensor | None = None
    # What DeferAndFuse's shape cache keys this tensor on (see shape_cache.layout_key): made when first needed,
    # or at creation from the cached description it was built from; dropped when the metadata changes.
    _layout: tuple | None = None

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if len(types) > 1 and _another_wrapper(types):
            return NotImplemented
        try:
            if _profiler._is_profiler_enabled:
                with hidden_from_profiler():
                    return _dispatch(func, args, kwargs or _EMPTY)
            return _dispatch(func, args, kwargs or _EMPTY)
        except Exception as error:
            if _FULL_TRACEBACKS:
                raise
            raise as_device_error(func, error) from None

    # A traceable wrapper subclass, so Dynamo and AOTAutograd trace through it onto the CPU data.
    def __tensor_flatten__(self) -> tuple[list[str], None]:
        if self._elem is None:
            unwrap(self, "compile")
        return ["_elem"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: Any, outer_size: Any, outer_stride: Any
    ) -> torch.Tensor:
        return wrap(inner["_elem"])

    def __coerce_same_metadata_as_tangent__(self, expected_metadata: Any, expected_type: type | None = None) -> Any:
        """AOTAutograd traced this gradient as a plain tensor (for an output it did not see derive from a tpu
        input, as RWKV's recurrent state): the compiled backward gets the CPU data it traced, not the wrapper."""
        if expected_type is None or expected_type is TpuTensor:
            return self
        return unwrap(self) if expected_type is torch.Tensor else None

    # ``param.data = other``: torch copies ``other``'s metadata into this tensor below the dispatcher, so the CPU
    # data (and what was derived from it) must follow here, or the tensor would keep computing with its old data.
    @property
    def data(self) -> torch.Tensor:
        return _Tensor.data.__get__(self)

    @data.setter
    def data(self, other: torch.Tensor) -> None:
        elem = unwrap(other) if type(other) is TpuTensor else None  # a deferred value runs first
        try:
            _Tensor.data.__set__(self, other)  # torch's checks (same device kind, shallow-copyable)
        except RuntimeError as error:
            if other.device.type != "cpu":
                raise
            # on a device the tensor would become a CPU tensor; a tpu wrapper cannot change device
            raise RuntimeError(
                "tensor.data = <cpu tensor> on a 'tpu' tensor is not emulated (the tensor cannot move to the CPU "
                "in place): keep a CPU copy (t.cpu()) beside the tpu tensor, or run on TorchTPU."
            ) from error
        self._elem = elem
        self._layout = None
        self.__dict__.pop("_meta", None)

    def untyped_storage(self) -> torch.UntypedStorage:
        """The wrapper's storage, remembered with the data behind it: resizing it resizes the data
        (:mod:`storage`). A pending tensor's data is made first: the program asked for its memory."""
        storage = _Tensor.untyped_storage(self)
        storage_data[storage._cdata] = self._elem if self._elem is not None else unwrap(self, "storage")
        return storage

    def data_ptr(self) -> int:
        """The address of the tensor's first element, as on a device: the data's (the wrapper's own storage has
        none, so every tensor read 0). Programs compare these to find shared memory (tied weights when saving,
        ``p.data_ptr() in seen``): equal for views at one place, offset by ``storage_offset`` for others, 0 for
        freed memory. A pending tensor's data is made first."""
        return (self._elem if self._elem is not None else unwrap(self, "storage")).data_ptr()

    # Growing in place: the wrapper cannot grow inside the dispatcher (the C++ caller holds it), so the methods
    # (``resize_``, ``resize_as_``, ``set_`` to a larger source) run the op, and when the data outgrew the wrapper
    # the tensor object takes over a new wrapper's internals (``torch.utils.swap_tensors``): every reference the
    # program holds sees the new size.
    def resize_(self, *sizes: Any, memory_format: Any = None) -> torch.Tensor:
        return _grown(self, lambda: _Tensor.resize_(self, *sizes, memory_format=memory_format))

    def resize_as_(self, other: torch.Tensor, memory_format: Any = None) -> torch.Tensor:
        return _grown(self, lambda: _Tensor.resize_as_(self, other, memory_format=memory_format))

    def set_(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return _grown(self, lambda: _Tensor.set_(self, *args, **kwargs))

    # Host reads: name the cause for the event log, materialise pending work, then read the CPU data.
    def item(self) -> Any:
        return _host_read(self, "item").item()

    def tolist(self) -> Any:
        return _host_read(self, "tolist").tolist()

    def __bool__(self) -> bool:
        return bool(_host_read(self, "bool"))

    def __float__(self) -> float:
        return float(_host_read(self, "float"))

    def __int__(self) -> int:
        return int(_host_read(self, "int"))

    def __index__(self) -> int:
        return _host_read(self, "int").__index__()

    def __format__(self, format_spec: str) -> str:
        if self.dim() == 0:
            return _host_read(self, "print").item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        cpu = _host_read(self, "print").detach()
        return render(self, cpu, tensor_contents)

    def numpy(self, *, force: bool = False) -> Any:
        if force:
            return _host_read(self, "numpy").detach().numpy()
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        # Pickle as torch does for storage-less PrivateUse1 tensors: on torch.load's weights-only allow-list,
        # restorable with map_location="cpu" in a process without the emulation.
        cpu = _host_read(self, "save").detach().clone()
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (cpu, self.dtype, str(self.device), self.requires_grad),
        )


# The data (CPU tensor) behind each wrapper storage a program asked for, by the storage's C++ address: how a
# storage resize finds the data to resize. A wrapper's storage and its data are made together (``wrap``; a
# pending tensor's data is its own from the flush on), and the entry is written again at each call. Weak, and on
# the data rather than the wrapper: torch.utils.swap_tensors (Module._apply, growing resize_) refuses a tensor
# that has a weak reference.
storage_data: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

# torch's own tracing tensors (torch.compile's fake and functional tensors), which meet tpu tensors as arguments
_TRACING_TENSORS = (FakeTensor, FunctionalTensor)
_TRACING_MODES = (
    torch._C._TorchDispatchModeKey.FAKE,
    torch._C._TorchDispatchModeKey.FUNCTIONAL,
    torch._C._TorchDispatchModeKey.PROXY,
)


def torch_is_tracing() -> bool:
    """Whether torch is tracing the op being dispatched rather than running it: Dynamo's fake propagation,
    AOTAutograd's functional trace of a compiled graph, ``make_fx``. Their tpu tensors carry fake or functional
    data that only lives inside the trace, so DeferAndFuse must not record such an op: a later flush would run
    it on tracing tensors outside their modes, and the trace would see deferred outputs instead of the data it
    follows (and flush a graph of tracing tensors to get it)."""
    return any(torch._C._get_dispatch_mode(key) is not None for key in _TRACING_MODES)


def _another_wrapper(types: Any) -> bool:
    """Whether another tensor subclass is among an op's arguments (funcol's AsyncCollectiveTensor around a tpu
    tensor, a user's wrapper subclass): on a device it unwraps itself and calls the op again, so the tpu tensor
    defers to it (``NotImplemented``) instead of taking the wrapper for a host tensor. torch's tracing tensors are
    handled here, as before."""
    return any(t is not TpuTensor and not issubclass(t, _TRACING_TENSORS) for t in types)


# Errors reach the user as the device's: no CPU kernel names, no emulator frames beneath this dispatcher.
# TPU_AGENT_EMULATOR_TRACEBACKS=1 keeps the full chain (for debugging the emulator itself).
_FULL_TRACEBACKS = os.environ.get("TPU_AGENT_EMULATOR_TRACEBACKS") == "1"


def as_device_error(func: Any, error: Exception) -> Exception:
    """``error`` as raised by the device for ``func``: cleaned text, traceback and chain cut at the dispatcher."""
    cleaned = kernels.device_error(func, error)
    cleaned.__cause__ = None
    cleaned.__suppress_context__ = True
    return cleaned.with_traceback(None)


def _grown(t: TpuTensor, resize: Callable[[], torch.Tensor]) -> torch.Tensor:
    try:
        return resize()
    except WrapperTooSmall:
        grown = unwrap(t)
        try:
            torch.utils.swap_tensors(t, wrap(grown))
        except RuntimeError:  # views of ``t`` or tensors autograd saved hold its wrapper: it cannot be swapped
            needed = tuple(grown.shape)
            grown.as_strided_(t.shape, t.stride(), t.storage_offset())
            raise RuntimeError(
                f"cannot grow a tpu tensor of shape {tuple(t.shape)} to {needed} in place while views of it (or "
                "tensors autograd saved from it) are alive: a tpu tensor's memory is sized when it is made. Drop "
                f"the views first, or make a new tensor (torch.empty({needed}, device='tpu')) and copy into it."
            ) from None
        return t


_enable_record_function = torch._C._autograd._enable_record_function


class _ProfilerHiding(threading.local):
    active = False


_hiding = _ProfilerHiding()


@contextlib.contextmanager
def hidden_from_profiler() -> Iterator[None]:
    """Run the emulator's own work unseen by ``torch.profiler`` (RecordFunction is per thread, as is this).

    The op that entered the emulator was recorded by the dispatcher before it reached Python; what runs beneath
    it (the CPU kernel, bf16 rounding copies, deferred-graph execution) is how the emulation works, not what
    the program asked the device to do, and would otherwise triple the records a profile has to stop,
    convert and analyse. Nested uses leave recording off until the outermost one ends.
    """
    if _hiding.active:
        yield
        return
    _hiding.active = True
    _enable_record_function(False)
    try:
        yield
    finally:
        _enable_record_function(True)
        _hiding.active = False


def render(t: torch.Tensor, cpu: torch.Tensor, tensor_contents: Any = None) -> str:
    """``tensor([...], device='tpu:0', ...)``: torch's own formatter fed with the CPU values."""
    from torch import _tensor_str

    prefix = f"{type(t).__name__}("
    if tensor_contents is None:
        if cpu.numel() == 0:
            tensor_contents = "[]"
        else:
            with torch.no_grad():
                tensor_contents = _tensor_str._tensor_str(cpu, len("tensor("))
    text = _tensor_str._str(t, tensor_contents=tensor_contents)
    is_parameter = text.startswith("Parameter(" + prefix)
    if is_parameter:  # printed as torch prints a plain Parameter
        text = text[len("Parameter(") : -1]
    head, tail = text[: len(prefix) + len(tensor_contents)], text[len(prefix) + len(tensor_contents) :]
    text = "tensor(" + head[len(prefix) :] + tail.replace("\n" + " " * len(prefix), "\n" + " " * len("tensor("))
    return "Parameter containing:\n" + text if is_parameter else text


def _new_wrapper(shape: Any, stride: Any, offset: int, dtype: torch.dtype) -> TpuTensor:
    """An empty tpu wrapper with this layout; the caller sets its data.

    The offset is passed only when it is not zero: torch's wrapper constructor spends about as long on an explicit
    ``storage_offset`` as on the rest of its arguments, and almost every tensor starts its storage."""
    if offset:
        return _make_wrapper(TpuTensor, shape, strides=stride, storage_offset=offset, dtype=dtype, device=DEVICE)
    return _make_wrapper(TpuTensor, shape, strides=stride, dtype=dtype, device=DEVICE)


def _wrapper_like(like: torch.Tensor) -> TpuTensor:
    """An empty tpu wrapper with ``like``'s shape, strides, offset and dtype; the caller sets its data."""
    return _new_wrapper(like.shape, like.stride(), like.storage_offset(), like.dtype)


def _carry_math_bits(r: torch.Tensor, like: torch.Tensor) -> None:
    """Give the wrapper its data's conjugate and negative bits, so torch resolves them before an op reaches
    the dispatcher (inside it the CPU kernels run with those dispatch keys off and would read raw values)."""
    if like.is_conj():
        torch._C._set_conj(r, True)
    if like.is_neg():
        torch._C._set_neg(r, True)


def wrap(elem: torch.Tensor) -> torch.Tensor:
    """A tpu tensor over the CPU tensor ``elem`` (sharing its data; no copy)."""
    try:
        r = _wrapper_like(elem)
        if type(elem) is _Tensor:  # fake/functional tensors while Dynamo traces have no memory to count
            memory.track(elem)
    except RuntimeError:
        unsupported.check_layout(elem)
        raise
    r._elem = elem
    if elem.is_complex() or elem.is_neg():
        _carry_math_bits(r, elem)
    return r


def wrap_pending(meta: torch.Tensor) -> TpuTensor:
    """A deferred tpu tensor with ``meta``'s metadata; the executor fills ``_elem`` at the flush."""
    if meta.layout is not torch.strided:  # refused when recorded, not at a later, unrelated flush
        unsupported.check_layout(meta)
    r = _wrapper_like(meta)
    r._meta = meta
    if meta.is_complex() or meta.is_neg():
        _carry_math_bits(r, meta)
    return r


def wrap_pending_layout(layout: tuple) -> TpuTensor:
    """A deferred tpu tensor with this layout key (``shape_cache.layout_key``'s tuple, which it keeps); its meta
    tensor is made when an uncached recording needs it."""
    _, shape, stride, offset, dtype, conj, neg = layout
    r = _new_wrapper(shape, stride, offset, dtype)
    r._layout = layout
    if conj:
        torch._C._set_conj(r, True)
    if neg:
        torch._C._set_neg(r, True)
    return r


def materialized(r: TpuTensor, elem: torch.Tensor) -> None:
    """Give a deferred tensor its CPU data (called by the executor)."""
    try:
        memory.track(elem)
    except RuntimeError:
        unsupported.check_layout(elem)
        raise
    r._elem = elem


def unwrap(t: torch.Tensor, cause: str = "cpu") -> torch.Tensor:
    """The CPU tensor behind a tpu tensor (materialising pending deferred work first); CPU tensors pass through.

    A tensor with data can still have pending work: an in-place op recorded under DeferAndFuse writes into its
    existing data at the flush (``total += x`` on a tensor from ``torch.zeros``), and a recorded reader needs
    the data as it is now. Either way the graph runs first, so the caller sees (and may change) final values.
    Callers may write to the result (collectives reduce in place), bypassing the tensor's version counter, so
    the MXU rounding cache is dropped."""
    if type(t) is not TpuTensor:
        return t
    mxu.clear_cache()
    elem = t._elem
    if elem is None or _pending_touches(elem):
        flush_pending(cause)
        elem = t._elem
        if elem is None:
            raise RuntimeError(
                "this tpu tensor has no data: the deferred computation that produced it failed at an earlier flush"
            )
    return elem


def _no_pending_graph(elem: torch.Tensor) -> bool:
    return False


def _nothing_to_flush(cause: str, site: Any = None) -> None:
    return None


# The pending DeferAndFuse graph, as this module sees it: whether it touches some CPU data, and how to run it.
# The eager-mode switch installs the graph's functions (see modes.apply_mode), so this module never imports
# the recorder that imports it.
_pending_touches: Callable[[torch.Tensor], bool] = _no_pending_graph
_flush_pending: Callable[[str, Any], None] = _nothing_to_flush


def set_pending_graph(touches: Callable[[torch.Tensor], bool], flush: Callable[[str, Any], None]) -> None:
    """Connect :func:`unwrap` and :func:`flush_pending` to the deferred graph (called by the mode switch)."""
    global _pending_touches, _flush_pending
    _pending_touches = touches
    _flush_pending = flush


def flush_pending(cause: str, site: Any = None) -> None:
    """Run the pending DeferAndFuse graph now (no-op when nothing is pending)."""
    _flush_pending(cause, site)


def _host_read(t: TpuTensor, cause: str) -> torch.Tensor:
    if host_read_override is not None:
        return host_read_override(t, cause)
    telemetry.host_sync(cause)
    try:
        return unwrap(t, cause)
    except Exception as error:  # a deferred op failed at this flush: report it without the executor's frames
        if _FULL_TRACEBACKS:
            raise
        error.__cause__ = None
        error.__suppress_context__ = True
        raise error.with_traceback(None) from None


# ----------------------------------------------------------------------------------------------- strict path


def _mixed_device(func: Any, t: torch.Tensor) -> None:
    if t.dim() != 0 and not ops.plan_of(func).mixed_device_ok and t.device.type != "meta":
        raise RuntimeError(MIXED_DEVICE_MESSAGE.format(a=DEVICE, b=t.device))


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
            return x.to(DATA_DEVICE)
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
                out[k] = DATA_DEVICE
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


class WrapperTooSmall(RuntimeError):
    """An in-place op grew a tensor's data beyond what its wrapper can describe (handled by ``resize_``)."""


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


def _strict(func: Any, args: tuple, kwargs: dict) -> Any:
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
        telemetry.host_sync("cpu")
    elif SMALL_DATA_BYTES and dst._elem is not None and not dst._elem.is_meta and _is_data_less(args[1]):
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
        telemetry.host_sync("cpu")


# Keyed by id(op): the lookup runs on every op, and an OpOverload hashes in Python (overloads live forever).
_SPECIAL: dict[int, Any] = {id(op): unsupported.check for op in unsupported.CHECKED_OPS}
_SPECIAL.update({id(op): _host_read_op for op in ops.HOST_READ_OPS})
_SPECIAL[id(torch.ops.aten.copy_.default)] = _copy_op
_SPECIAL[id(torch.ops.aten._to_copy.default)] = _to_copy_op


# The active dispatcher; the eager-mode switch replaces it (see modes.apply_mode).
_dispatch = _strict


def set_dispatcher(fn: Any) -> None:
    global _dispatch
    _dispatch = fn


strict_dispatch = _strict
