"""The emulated ``tpu`` tensor: a PrivateUse1 wrapper subclass whose data lives in a CPU tensor.

Every ATen op on a tpu tensor reaches :meth:`TpuTensor.__torch_dispatch__` below autograd, so autograd,
optimizers and ``nn`` modules work unchanged. The entry hands the op to the dispatcher of the eager mode, which
the mode switch installs (:func:`set_dispatcher`, :mod:`.modes`):

* Strict (DEFER_NEVER): :func:`tpu_agent.runtime.emulated.dispatch.strict_dispatch` unwraps, runs the op on the
  CPU and wraps the results (Debug Eager then checks the outputs).
* DeferAndFuse: :func:`tpu_agent.runtime.emulated.deferred.record` records the op into the pending graph, which
  runs at a flush.

This module holds what every path shares: the tensor class, wrapping a CPU tensor (:func:`wrap`) and giving a
deferred tensor its data (:func:`materialized`), reading the data back (:func:`unwrap`, host reads), and the
connection to the pending graph (:func:`set_pending_graph`). While ``torch.profiler`` records, the emulator's own
work beneath each op is hidden from it (:func:`hidden_from_profiler`), as a TPU host shows only the ops the
program dispatched.

Views keep TorchTPU's aliasing: a view op returns a tpu tensor over a CPU view of the base's CPU tensor, so an
in-place write through the view is visible in the base.
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

from tpu_agent.runtime.emulated import kernels, memory, mxu, placement, telemetry, unsupported
from tpu_agent.runtime.emulated.flush_cause import FlushCause

_EMPTY: dict[str, Any] = {}
_Tensor = torch.Tensor
_make_wrapper = torch.Tensor._make_wrapper_subclass
DEVICE: torch.device | None = None  # torch.device("tpu", 0), set by device.register()


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
            unwrap(self, FlushCause.COMPILE)
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
        storage_data[storage._cdata] = self._elem if self._elem is not None else unwrap(self, FlushCause.STORAGE)
        return storage

    def data_ptr(self) -> int:
        """The address of the tensor's first element, as on a device: the data's (the wrapper's own storage has
        none, so every tensor read 0). Programs compare these to find shared memory (tied weights when saving,
        ``p.data_ptr() in seen``): equal for views at one place, offset by ``storage_offset`` for others, 0 for
        freed memory. A pending tensor's data is made first."""
        return (self._elem if self._elem is not None else unwrap(self, FlushCause.STORAGE)).data_ptr()

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
        return _host_read(self, FlushCause.ITEM).item()

    def tolist(self) -> Any:
        return _host_read(self, FlushCause.TOLIST).tolist()

    def __bool__(self) -> bool:
        return bool(_host_read(self, FlushCause.BOOL))

    def __float__(self) -> float:
        return float(_host_read(self, FlushCause.FLOAT))

    def __int__(self) -> int:
        return int(_host_read(self, FlushCause.INT))

    def __index__(self) -> int:
        return _host_read(self, FlushCause.INT).__index__()

    def __format__(self, format_spec: str) -> str:
        if self.dim() == 0:
            return _host_read(self, FlushCause.PRINT).item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        cpu = _host_read(self, FlushCause.PRINT).detach()
        return render(self, cpu, tensor_contents)

    def numpy(self, *, force: bool = False) -> Any:
        if force:
            return _host_read(self, FlushCause.NUMPY).detach().numpy()
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        # Pickle as torch does for storage-less PrivateUse1 tensors: on torch.load's weights-only allow-list,
        # restorable with map_location="cpu" in a process without the emulation.
        cpu = _host_read(self, FlushCause.SAVE).detach().clone()
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


class WrapperTooSmall(RuntimeError):
    """An in-place op grew a tensor's data beyond what its wrapper can describe (handled by ``resize_``)."""


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


def unwrap(t: torch.Tensor, cause: FlushCause = FlushCause.CPU) -> torch.Tensor:
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


def _nothing_to_flush(cause: FlushCause, site: Any = None) -> None:
    return None


# The pending DeferAndFuse graph, as this module sees it: whether it touches some CPU data, and how to run it.
# The eager-mode switch installs the graph's functions (see modes.apply_mode), so this module never imports
# the recorder that imports it.
_pending_touches: Callable[[torch.Tensor], bool] = _no_pending_graph
_flush_pending: Callable[[FlushCause, Any], None] = _nothing_to_flush


def set_pending_graph(touches: Callable[[torch.Tensor], bool], flush: Callable[[FlushCause, Any], None]) -> None:
    """Connect :func:`unwrap` and :func:`flush_pending` to the deferred graph (called by the mode switch)."""
    global _pending_touches, _flush_pending
    _pending_touches = touches
    _flush_pending = flush


def flush_pending(cause: FlushCause, site: Any = None) -> None:
    """Run the pending DeferAndFuse graph now (no-op when nothing is pending)."""
    _flush_pending(cause, site)


def _host_read(t: TpuTensor, cause: FlushCause) -> torch.Tensor:
    answer = placement.host_read
    if answer is not None:  # estimate's capture-only mode
        return answer(t, cause)
    telemetry.host_sync(cause)
    try:
        return unwrap(t, cause)
    except Exception as error:  # a deferred op failed at this flush: report it without the executor's frames
        if _FULL_TRACEBACKS:
            raise
        error.__cause__ = None
        error.__suppress_context__ = True
        raise error.with_traceback(None) from None


def set_device(device: torch.device) -> None:
    """The device every tpu tensor reports (``tpu:0``); set when the device registers (:func:`device.register`)."""
    global DEVICE
    DEVICE = device


def _not_registered(func: Any, args: tuple, kwargs: dict) -> Any:
    raise RuntimeError(
        f"{func} on a tpu tensor before the emulated tpu device was registered: call "
        "tpu_agent.runtime.emulated.activate() first"
    )


# The active dispatcher: Strict's from device registration on, then the eager mode's (see modes.apply_mode).
_dispatch: Callable[[Any, tuple, dict], Any] = _not_registered


def set_dispatcher(fn: Callable[[Any, tuple, dict], Any]) -> None:
    """Every op on a tpu tensor goes to ``fn`` from now on (the dispatcher lives above this module)."""
    global _dispatch
    _dispatch = fn
