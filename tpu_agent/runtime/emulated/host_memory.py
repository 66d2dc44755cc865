"""Pinned host memory for the emulated ``tpu`` device: ``Tensor.pin_memory()``, ``is_pinned()`` and
``DataLoader(pin_memory=True)``.

TorchTPU has a pinned host allocator, so migrated code keeps ``pin_memory=True``. torch asks the current
accelerator's hooks for a pinned allocator, and the Python hook interface of a PrivateUse1 backend has none
(``getPinnedMemoryAllocator`` raises NotImplementedError). The emulation therefore pins at the level torch's
Python code calls it: ``pin_memory()`` returns a page-locked stand-in (a copy, as torch returns a copy in
pinned memory) and records its storage as pinned, so ``is_pinned()`` answers as on a TPU host for it and
every view of it. ``non_blocking=True`` copies already work: the emulated device has no asynchronous copy
engine, so they complete at once, which is a valid execution of a non-blocking copy.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_pinned_storages: dict[int, Any] = {}  # storage address -> weakref to a tensor that keeps the storage alive


def _storage_address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _is_pinned(t: torch.Tensor) -> bool:
    if t.device.type != "cpu" or t.layout is not torch.strided:
        return False
    entry = _pinned_storages.get(_storage_address(t))
    return entry is not None and entry() is not None


def is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    """``Tensor.is_pinned()``: whether this host tensor's memory came from :func:`pin_memory`."""
    return _is_pinned(self)


def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    """``Tensor.pin_memory()``: a pinned copy of a host tensor (the tensor itself when already pinned)."""
    if self.device.type != "cpu":
        raise RuntimeError(f"cannot pin '{self.device.type}' memory: only host (cpu) tensors can be pinned")
    if _is_pinned(self):
        return self
    pinned = self.clone(memory_format=torch.contiguous_format) if self.layout is torch.strided else self.clone()
    address = _storage_address(pinned)
    _pinned_storages[address] = weakref.ref(pinned)
    weakref.finalize(pinned, _pinned_storages.pop, address, None)
    return pinned


def install() -> None:
    """Route ``Tensor.pin_memory``/``is_pinned`` to the emulation (once, at device registration)."""
    pin_memory.__doc__ = torch.Tensor.pin_memory.__doc__
    is_pinned.__doc__ = torch.Tensor.is_pinned.__doc__
    torch.Tensor.pin_memory = pin_memory
    torch.Tensor.is_pinned = is_pinned
