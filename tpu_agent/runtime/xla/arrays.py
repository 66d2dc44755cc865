"""CPU tensors and JAX arrays over the same memory, and the input buffers kept as arrays between flushes.

Every executable call passes its inputs to XLA as JAX arrays and takes its results back as CPU tensors, through
DLPack, without copying (:func:`to_jax`, :func:`to_torch`). Making one array still costs ~10 us in jaxlib: a
DeferAndFuse flush passes every storage it reads (a model's parameters and optimizer state, a hundred or more),
so on a small model that cost exceeds the executable's own run. Those storages are the same ones step after
step, and an array over a storage's memory stays right while the memory stays where it is, whatever is written
into it. So the flat tensor the planner cuts views from and its array are kept per storage (:func:`buffer`,
:func:`array`), made again when the storage was reallocated, and dropped once nothing but this cache holds the
storage (:func:`sweep`, once per flush).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import torch
from jax._src.lib import _jax

# Executables run on XLA:CPU. Naming the platform before any device is asked for keeps an installed libtpu (the
# estimate extra) from being initialised for execution, which would print its "no TPU here" errors into every run.
jax.config.update("jax_platforms", "cpu")
_CPU_DEVICE = jax.devices("cpu")[0]
_DLPACK_CPU = 1  # DLDeviceType.kDLCPU
# The direct DLPack entry points of torch and jaxlib: ``jax.dlpack.from_dlpack`` and ``torch.from_dlpack`` add
# ~40 us of Python checks per array (device lookups, dtype canonicalisation); the direct calls make the same
# zero-copy alias. dtypes DLPack carries as they are; bool goes through a copy (DLPack bool support varies).
_DIRECT_DTYPES = frozenset(
    {torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int16, torch.int8, torch.uint8}
)
# x64 is off: the executables are compiled for 32-bit types. 64-bit tensors are narrowed by torch (one cast, as
# JAX would do with an eager XLA op on the imported array: ~140 us for a batch of token ids, instead of ~15 us).
_NARROWED = {torch.int64: torch.int32, torch.float64: torch.float32}


def to_jax(t: torch.Tensor) -> jax.Array:
    """A JAX array over a CPU tensor's data (no copy for contiguous tensors of DLPack dtypes)."""
    if t.dtype is torch.bool:
        return jnp.asarray(t.numpy())
    narrowed = _NARROWED.get(t.dtype)
    if narrowed is not None:
        t = t.detach().to(narrowed)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype in _DIRECT_DTYPES:
        source = t.detach() if t.requires_grad else t
        try:
            return _jax.dlpack_managed_tensor_to_buffer(
                torch._C._to_dlpack(source), _CPU_DEVICE, None, None, _DLPACK_CPU
            )
        except Exception:  # noqa: BLE001 - unaligned or unusual storage: the general path below copies it
            pass
    try:
        return jax.dlpack.from_dlpack(t.detach())
    except Exception:  # noqa: BLE001 - unaligned or unusual storage: one copy through a fresh tensor
        return jax.dlpack.from_dlpack(t.detach().clone())


def to_torch(a: jax.Array) -> torch.Tensor:
    """A CPU tensor over a JAX array's buffer (no copy)."""
    if a.dtype == jnp.bool_:
        return torch.from_numpy(jax.device_get(a).copy())
    return torch._C._from_dlpack(_jax.buffer_to_dlpack_managed_tensor(a, stream=None))


@dataclass
class _Resident:
    """One storage read by executables: its flat tensor and, once passed to XLA, the array over its memory."""

    storage: torch.UntypedStorage  # held: while the entry lives its memory cannot be freed and its address reused
    flat: torch.Tensor
    data_ptr: int  # where the memory was, and its size, when the entry was made: after a resize_ it is remade
    nbytes: int
    array: jax.Array | None = None


_by_storage: dict[int, _Resident] = {}  # the StorageImpl's address (UntypedStorage._cdata) -> its entry
_by_flat: dict[int, _Resident] = {}  # id(entry.flat) -> entry: how array() recognises a kept buffer
_use_count = torch._C._storage_Use_Count
_held: list[int] = []  # the storage references an entry holds itself (measured once: see _entry_references)


def buffer(elem: torch.Tensor) -> torch.Tensor:
    """The whole storage behind ``elem`` as a flat tensor of its dtype (the replay cuts views from it); the same
    tensor object at every flush while the storage keeps its memory, so its array is made once."""
    storage = elem.untyped_storage()
    entry = _by_storage.get(storage._cdata)
    if (
        entry is None
        or entry.data_ptr != storage.data_ptr()
        or entry.nbytes != storage.nbytes()
        or entry.flat.dtype is not elem.dtype
    ):
        if entry is not None:
            del _by_flat[id(entry.flat)]
        flat = flat_storage(elem, storage)
        entry = _by_storage[storage._cdata] = _Resident(storage, flat, storage.data_ptr(), storage.nbytes())
        _by_flat[id(flat)] = entry
    return entry.flat


def flat_storage(elem: torch.Tensor, storage: torch.UntypedStorage | None = None) -> torch.Tensor:
    """The whole storage behind ``elem`` (``storage``, when the caller has it) as one flat tensor of its dtype, on
    its device: made afresh (:func:`buffer` keeps them)."""
    if storage is None:
        storage = elem.untyped_storage()
    numel = storage.nbytes() // elem.element_size()
    return torch.empty(0, dtype=elem.dtype, device=elem.device).set_(storage, 0, (numel,), (1,))


def array(t: torch.Tensor) -> jax.Array:
    """The JAX array over ``t``: kept from the last call for a :func:`buffer`, made now for any other tensor.
    Only an array that aliases the memory is kept (bool and 64-bit tensors reach XLA as copies)."""
    entry = _by_flat.get(id(t))
    if entry is None or entry.flat is not t:
        return to_jax(t)
    if entry.array is None:
        made = to_jax(t)
        if made.unsafe_buffer_pointer() != t.data_ptr() or t.numel() == 0:
            return made
        entry.array = made
    return entry.array


def sweep() -> None:
    """Drop the entries of storages nothing but this cache holds (their tensors are gone): their memory is freed."""
    if not _by_storage:
        return
    held = _held[0] if _held else _entry_references()
    for key, entry in list(_by_storage.items()):
        if _use_count(key) <= held:
            del _by_storage[key], _by_flat[id(entry.flat)]


def _entry_references() -> int:
    """How many references to its storage an entry holds, measured on this torch (not assumed)."""
    t = torch.empty(4)
    storage = t.untyped_storage()
    entry = _Resident(storage, flat_storage(t, storage), storage.data_ptr(), storage.nbytes())
    entry.array = to_jax(entry.flat)
    del t, storage
    _held.append(_use_count(entry.storage._cdata))
    return _held[0]


__all__ = ["array", "buffer", "flat_storage", "sweep", "to_jax", "to_torch"]
