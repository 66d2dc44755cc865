"""Pinned host memory for the emulated ``tpu`` device: ``Tensor.pin_memory()``, ``is_pinned()`` and
``DataLoader(pin_memory=True)``.

TorchTPU has a pinned host allocator, so migrated code keeps ``pin_memory=True``. torch asks the current
accelerator's hooks for a pinned allocator, and the Python hook interface of a PrivateUse1 backend has none
(``getPinnedMemoryAllocator`` raises NotImplementedError). The emulation therefore pins at the level torch's
Python code calls it: ``pin_memory()`` returns a page-locked stand-in (a copy, as torch returns a copy in
pinned memory) and records its storage as pinned, so ``is_pinned()`` answers as on a TPU host for it and
every view of it. Factories called with ``pin_memory=True`` (``torch.empty(..., pin_memory=True)``,
``Tensor.new_zeros(..., pin_memory=True)``) reach the same allocator, so they are wrapped to build the tensor
unpinned and record its fresh storage as pinned. ``non_blocking=True`` copies already work: the emulated device has no asynchronous copy
engine, so they complete at once, which is a valid execution of a non-blocking copy.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._device

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
    return _record_pinned(pinned)


def _record_pinned(fresh: torch.Tensor) -> torch.Tensor:
    """Record a host tensor that owns its fresh storage as pinned, for as long as that storage lives."""
    address = _storage_address(fresh)
    _pinned_storages[address] = weakref.ref(fresh)
    weakref.finalize(fresh, _pinned_storages.pop, address, None)
    return fresh


# Every factory of torch 2.13 that takes ``pin_memory`` (``torch.range``/``as_tensor``/``new_tensor`` do not).
_PINNABLE_FACTORIES = (
    "empty", "empty_like", "empty_permuted", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "arange",
    "linspace", "logspace", "eye", "tensor", "scalar_tensor", "tril_indices", "triu_indices", "hamming_window",
    "hann_window", "bartlett_window", "blackman_window", "kaiser_window",
)  # fmt: skip
_PINNABLE_TENSOR_METHODS = ("new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full")


def _pinning_factory(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``factory`` with ``pin_memory=True`` served by the emulation (other calls pass straight through)."""

    @functools.wraps(factory)
    def build(*args: Any, **kwargs: Any) -> torch.Tensor:
        if not kwargs.get("pin_memory"):
            return factory(*args, **kwargs)
        kwargs["pin_memory"] = False
        result = factory(*args, **kwargs)
        if result.device.type != "cpu" or result.layout is not torch.strided:
            raise RuntimeError(
                f"{factory.__name__}(pin_memory=True): only dense host (cpu) tensors can be pinned, "
                f"not a {result.layout} tensor on '{result.device.type}'"
            )
        return _record_pinned(result)

    build.__wrapped_factory__ = factory  # type: ignore[attr-defined]  # marks it wrapped (install is idempotent)
    return build


def install() -> None:
    """Route ``Tensor.pin_memory``/``is_pinned`` to the emulation (once, at device registration)."""
    pin_memory.__doc__ = torch.Tensor.pin_memory.__doc__
    is_pinned.__doc__ = torch.Tensor.is_pinned.__doc__
    torch.Tensor.pin_memory = pin_memory
    torch.Tensor.is_pinned = is_pinned
    # ``with torch.device(...)`` recognises factories by identity in a cached set: the wrappers call the
    # original builtins, which must stay in it however late the set is first built.
    device_constructors = torch.utils._device._device_constructors()
    for owner, names in ((torch, _PINNABLE_FACTORIES), (torch.Tensor, _PINNABLE_TENSOR_METHODS)):
        for name in names:
            factory = getattr(owner, name)
            if not hasattr(factory, "__wrapped_factory__"):
                setattr(owner, name, _pinning_factory(factory))
                if owner is torch:  # TorchScript finds builtins by identity: the wrapper stands for the aten op
                    device_constructors.add(factory)
                    torch.jit._builtins._register_builtin(getattr(torch, name), f"aten::{name}")
