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
"""

from __future__ import annotations

from typing import Any

import torch

from tpu_agent.runtime.emulated import tensor as tt

_resize = torch._C.StorageBase.resize_
_nbytes = torch._C.StorageBase.nbytes


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
    tt.flush_pending("storage")
    if _nbytes(data) != size:
        _resize(data, size)
    return storage


def nbytes(storage: Any) -> Any:
    """``UntypedStorage.nbytes`` (and ``size()``): a tpu storage reports its tensor's data, resized or not. An int,
    or while torch.compile traces a symbolic size (left symbolic: reading it would specialise the graph)."""
    data = tt.storage_data.get(storage._cdata) if storage.device.type == "tpu" else None
    return _nbytes(storage if data is None else data.untyped_storage())


def install() -> None:
    """Route ``torch.UntypedStorage``'s resize and size through this module (once, at device registration)."""
    torch.UntypedStorage.resize_ = resize_
    torch.UntypedStorage.nbytes = nbytes
