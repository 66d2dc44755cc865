"""CPU tensors and JAX arrays over the same memory, kept from one executable call to the next.

Every executable call passes its inputs to XLA as JAX arrays and takes its results back as CPU tensors, through
DLPack, without copying (:func:`to_jax`, :func:`to_torch`). Making one array still costs jaxlib several microseconds
(docs/runtime.md, "Measurements behind the design"), and a training step passes a hundred or more (a model's parameters and optimizer state, to every DeferAndFuse flush
and every compiled forward and backward): on a small model more than the executable's own run. Those are the
same tensors step after step, and an array over a tensor's memory stays right whatever is written into it, as
long as the memory and layout stay. So :func:`array` keeps each tensor's array while the tensor lives with the
same memory and layout, and :func:`buffer` keeps, per storage, the flat tensor a DeferAndFuse replay cuts its
views from (remade when the storage is reallocated, dropped by :func:`sweep` once its tensors are gone).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import torch
from jax._src.lib import _jax
from torch._prims_common import make_contiguous_strides_for

from tpu_agent.runtime.xla import jax_setup  # noqa: F401 - the CPU platform, before the first device is named

_CPU_DEVICE = jax.devices("cpu")[0]
_DLPACK_CPU = 1  # DLDeviceType.kDLCPU
# The direct DLPack entry points of torch and jaxlib: ``jax.dlpack.from_dlpack`` and ``torch.from_dlpack`` add
# ~40 us of Python checks per array (device lookups, dtype canonicalisation); the direct calls make the same
# zero-copy alias. dtypes DLPack carries as they are; bool goes through a copy (DLPack bool support varies).
_DIRECT_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.bfloat16,
        torch.float16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
    }
)


def to_jax(t: torch.Tensor) -> jax.Array:
    """A JAX array over a CPU tensor's data (no copy for contiguous tensors of DLPack dtypes)."""
    if t.dtype is torch.bool:
        return jnp.asarray(t.numpy())
    if not t.is_contiguous():
        t = t.contiguous()
    t = _row_major_strides(t)
    if t.dtype in _DIRECT_DTYPES:
        try:  # from a detached tensor: the array holds the storage, not ``t`` (see :func:`array`)
            return _jax.dlpack_managed_tensor_to_buffer(
                torch._C._to_dlpack(t.detach()), _CPU_DEVICE, None, None, _DLPACK_CPU
            )
        except Exception:  # noqa: BLE001 - unaligned or unusual storage: the general path below copies it
            pass
    try:
        return jax.dlpack.from_dlpack(t.detach())
    except Exception:  # noqa: BLE001 - unaligned or unusual storage: one copy through a fresh tensor
        return jax.dlpack.from_dlpack(t.detach().clone())


def _row_major_strides(t: torch.Tensor) -> torch.Tensor:
    """A contiguous ``t`` as a view with row-major strides in its size-1 dimensions too. torch calls a tensor
    contiguous whatever the stride of a size-1 dimension (a ``[2, 16, 1]`` attention statistic with strides
    ``(16, 1, 16)``, from Perceiver's backward); DLPack passes that stride on, JAX reads a transposed layout from it,
    and an executable compiled for row-major inputs refuses the array."""
    expected = make_contiguous_strides_for(t.shape)
    if t.stride() == expected:
        return t
    return t.as_strided(t.shape, expected, t.storage_offset())


def to_torch(a: jax.Array) -> torch.Tensor:
    """A CPU tensor over a JAX array's buffer (no copy). Executables give bool results as uint8 (see
    :func:`result`)."""
    return torch._C._from_dlpack(_jax.buffer_to_dlpack_managed_tensor(a, stream=None))


@dataclass
class _Flat:
    """One storage read by DeferAndFuse executables, as the flat tensor their replay cuts views from."""

    storage: torch.UntypedStorage  # held: while the entry lives its memory cannot be freed and its address reused
    flat: torch.Tensor
    data_ptr: int  # where the memory was, and its size, when the entry was made: after a resize_ it is remade
    nbytes: int


@dataclass
class _Alias:
    """The array over a tensor passed to an executable before, and the layout it was made for."""

    tensor: weakref.ref[torch.Tensor]
    data_ptr: int
    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype
    array: jax.Array


_flats: dict[int, _Flat] = {}  # the StorageImpl's address (UntypedStorage._cdata) -> its flat tensor
_aliases: dict[int, _Alias] = {}  # id(tensor) -> the array over it, while the tensor lives
_use_count = torch._C._storage_Use_Count


def buffer(elem: torch.Tensor) -> torch.Tensor:
    """The whole storage behind ``elem`` as a flat tensor of its dtype (the replay cuts views from it); the same
    tensor object at every flush while the storage keeps its memory, so its array is made once."""
    storage = elem.untyped_storage()
    entry = _flats.get(storage._cdata)
    if (
        entry is None
        or entry.data_ptr != storage.data_ptr()
        or entry.nbytes != storage.nbytes()
        or entry.flat.dtype is not elem.dtype
    ):
        entry = _flats[storage._cdata] = _Flat(
            storage, flat_storage(elem, storage), storage.data_ptr(), storage.nbytes()
        )
    return entry.flat


def flat_storage(elem: torch.Tensor, storage: torch.UntypedStorage | None = None) -> torch.Tensor:
    """The whole storage behind ``elem`` (``storage``, when the caller has it) as one flat tensor of its dtype, on
    its device: made afresh (:func:`buffer` keeps them)."""
    if storage is None:
        storage = elem.untyped_storage()
    numel = storage.nbytes() // elem.element_size()
    return torch.empty(0, dtype=elem.dtype, device=elem.device).set_(storage, 0, (numel,), (1,))


def array(t: torch.Tensor) -> jax.Array:
    """The JAX array over ``t``, kept from the last call while ``t`` lives with the same memory and layout (a
    parameter, a :func:`buffer`). Only an array that aliases the memory is kept (64-bit tensors reach XLA as
    copies); it holds ``t``'s storage, never ``t`` itself, so ``t`` dies as it would without it. A bool tensor
    passes as its bytes, a uint8 array: the executables take bool inputs that way (XLA's bool is one byte too)."""
    alias = _aliases.get(id(t))
    if (
        alias is not None
        and alias.data_ptr == t.data_ptr()
        and alias.shape == t.shape
        and alias.stride == t.stride()
        and alias.dtype is t.dtype
        and alias.tensor() is t
    ):
        return alias.array
    made = to_jax(t.view(torch.uint8) if t.dtype is torch.bool else t)
    if t.numel() and made.unsafe_buffer_pointer() == t.data_ptr():
        _keep(t, made)
    return made


def result(a: jax.Array, dtype: torch.dtype | None) -> torch.Tensor:
    """An executable's output as a CPU tensor over its buffer (:func:`to_torch`), read as ``dtype`` where that is
    bool (the output is its bytes), that :func:`array` gives back as ``a`` itself: the activations a compiled
    forward saves come straight back as the backward's inputs, and a DeferAndFuse graph's results are the next
    graph's inputs, so their arrays are not made a second time."""
    t = to_torch(a)
    if dtype is torch.bool:
        t = t.view(torch.bool)
    if t.numel():
        _keep(t, a)
    return t


def storage_end(shape: Sequence[int], stride: Sequence[int], offset: int) -> int:
    """One past the last storage element a layout reads (``offset`` itself when it reads none); torch strides are
    never negative."""
    if not all(shape):
        return offset
    return offset + sum((n - 1) * step for n, step in zip(shape, stride, strict=True)) + 1


def laid_out(value: torch.Tensor, stride: tuple[int, ...], offset: int) -> torch.Tensor:
    """``value`` with these strides and storage offset: itself when it has them, else a copy laid out so. XLA gives
    dense row-major results; a consumer may rely on the layout torch's kernels would have given (a traced
    ``view`` of a transposed result, a deferred tensor's views cut at the offsets its metadata promised)."""
    if value.stride() == stride and value.storage_offset() == offset:
        return value
    extent = storage_end(value.shape, stride, offset)
    out = torch.empty(max(extent, 1), dtype=value.dtype).as_strided(value.shape, stride, offset)
    return out.copy_(value)


def _keep(t: torch.Tensor, made: jax.Array) -> None:
    """Remember ``made`` as the array over ``t`` until ``t`` dies or its memory or layout changes."""
    key = id(t)
    _aliases[key] = _Alias(weakref.ref(t, _forget(key)), t.data_ptr(), t.shape, t.stride(), t.dtype, made)


def _forget(key: int) -> Callable[[weakref.ref[torch.Tensor]], None]:
    """The weakref callback that drops a dead tensor's array (before its id can be reused)."""

    def forget(_dead: weakref.ref[torch.Tensor]) -> None:
        _aliases.pop(key, None)

    return forget


def sweep() -> None:
    """Drop the flat tensors of storages nothing but this cache holds (their tensors are gone), freeing them."""
    if not _flats:
        return
    without_array, with_array = _entry_references()
    for key, entry in list(_flats.items()):
        if _use_count(key) <= (with_array if id(entry.flat) in _aliases else without_array):
            del _flats[key]


@functools.cache
def _entry_references() -> tuple[int, int]:
    """How many references to its storage a flat entry holds, before and after its array is made: measured on
    this torch, not assumed."""
    t = torch.empty(4)
    entry = _Flat(t.untyped_storage(), flat_storage(t), t.data_ptr(), t.untyped_storage().nbytes())
    del t
    without_array = _use_count(entry.storage._cdata)
    made = array(entry.flat)
    with_array = _use_count(entry.storage._cdata)
    del made
    return without_array, with_array


__all__ = ["array", "buffer", "flat_storage", "laid_out", "result", "storage_end", "sweep", "to_jax", "to_torch"]
