"""Resizing the storage of an emulated ``tpu`` tensor: ``t.untyped_storage().resize_(n)``.

Programs resize a device tensor's storage to free and re-allocate its memory while the tensor object lives on:
FSDP2 frees an unsharded parameter after use (``resize_(0)``) and re-allocates it before the next all-gather,
and torch.compile's fake tensors copy a freed storage's zero size (``meta_utils``: a real tensor whose storage
is empty gets a fake one whose storage is resized to 0). On a device backend torch reaches the backend's C++
hook ``resizePrivateUse1Bytes``. A Python backend cannot provide it: ``torch._C._acc.PrivateUse1Hooks`` forwards
only ``is_available``/``is_built``/``has_primary_context`` to Python, and a wrapper subclass's own storage is a
size record without data, which torch refuses to change (``invalid python storage``).

So the emulation sits where torch calls it from Python, ``torch.UntypedStorage.resize_`` (and ``nbytes``, which
``size()`` reads): for a tpu storage, the data behind the tensor whose ``untyped_storage()`` gave it (:data:`tensor.storage_data`)
has its storage resized. That is the CPU storage all views of the tensor share, so freeing it frees every
view at once, as device storage does; a re-allocated storage holds undefined values until written, as on a
device. ``torch.ops.inductor.resize_storage_bytes_`` (FSDP2 under torch.compile) needs none of this: it is an op,
which the dispatcher runs on the data as any other.

FSDP1 reaches the same through ``tensor._typed_storage()._resize_`` / ``._size()`` (``TypedStorage`` forwards to
the untyped storage), and also asks whether two flat parameters share memory and whether one is allocated by
``untyped_storage().data_ptr()``, which a wrapper's storage refuses as well: :func:`data_ptr` answers with the
data's. It records streams with torch dispatch off, which reaches the ``PrivateUse1`` kernel :func:`_record_stream`.
"""

from __future__ import annotations

from typing import Any

import torch

from tpu_agent.runtime.emulated import tensor as tt
from tpu_agent.runtime.emulated.flush_cause import FlushCause

_resize = torch._C.StorageBase.resize_
_nbytes = torch._C.StorageBase.nbytes
_data_ptr = torch._C.StorageBase.data_ptr


def _data_storage(storage: Any) -> torch.UntypedStorage:
    """The storage of the data behind the tpu tensor that ``storage`` belongs to."""
    data = tt.storage_data.get(storage._cdata)
    if data is None:
        raise RuntimeError(
            "UntypedStorage.resize_ on the 'tpu' device: this storage's tensor is gone, and a tpu storage is "
            "resized through its tensor. Call tensor.untyped_storage() and resize that while the tensor is alive."
        )
    return data.untyped_storage()


def resize_(storage: Any, size: int) -> Any:
    """``UntypedStorage.resize_``: a tpu storage resizes its tensor's data (see the module docstring)."""
    if storage.device.type != "tpu":
        return _resize(storage, size)
    data = _data_storage(storage)
    # pending deferred ops may still read or write this memory (FSDP2's copy-out of the all-gather buffer it is
    # about to free): they run before the storage changes size
    tt.flush_pending(FlushCause.STORAGE)
    if _nbytes(data) != size:
        _resize(data, size)
    return storage


def _behind(storage: Any) -> Any:
    """The storage of the data behind a tpu ``storage`` when its tensor is known; else ``storage`` itself."""
    data = tt.storage_data.get(storage._cdata) if storage.device.type == "tpu" else None
    return storage if data is None else data.untyped_storage()


def nbytes(storage: Any) -> Any:
    """``UntypedStorage.nbytes`` (and ``size()``): a tpu storage reports its tensor's data, resized or not. An int,
    or while torch.compile traces a symbolic size (left symbolic: reading it would specialise the graph)."""
    return _nbytes(_behind(storage))


def data_ptr(storage: Any) -> int:
    """``UntypedStorage.data_ptr``: a tpu storage's is its data's, so two tensors share memory exactly when their
    storages' pointers match (FSDP1's ``_same_storage``), and a freed storage's is 0 (``_data_ptr_allocated``)."""
    return _data_ptr(_behind(storage))


def _record_stream(tensor: torch.Tensor, stream: Any) -> None:
    """``Tensor.record_stream`` on a tpu tensor: nothing to do. On a device it keeps the caching allocator from
    reusing the memory while ``stream`` may still use it; here the memory is the CPU data, which a resize frees
    only after the pending work ran (:func:`resize_`). FSDP1 calls it with torch dispatch off
    (``_no_dispatch_record_stream``), so it needs the ``PrivateUse1`` kernel, not the tensor subclass."""


_libraries: list[torch.library.Library] = []


def install() -> None:
    """Route ``torch.UntypedStorage``'s resize and size through this module (once, at device registration)."""
    torch.UntypedStorage.resize_ = resize_
    torch.UntypedStorage.nbytes = nbytes
    torch.UntypedStorage.data_ptr = data_ptr
    lib = torch.library.Library("aten", "IMPL")
    _libraries.append(lib)  # a Library's kernels live as long as the object
    lib.impl("record_stream", _record_stream, "PrivateUse1")
