"""FSDP2's storage resizing on emulated ``tpu`` tensors.

FSDP2 frees and re-allocates unsharded parameters with ``untyped_storage().resize_()``. On TorchTPU a tpu
tensor has a real device storage; the emulated tensor's storage is its CPU tensor's (views share it, so
resizing it frees and restores every view at once, as device storage does). FSDP2 imports the two helpers
by name, so both of its modules get the storage-aware versions.
"""

from __future__ import annotations

import torch

from tpu_agent.runtime.emulated import tensor as tt


def _cpu_storage(t: torch.Tensor) -> torch.UntypedStorage:
    # unwrap runs pending deferred ops that may still read or write this memory (e.g. FSDP2's copy-out of the
    # all-gather buffer it is about to free) before the storage changes size.
    return tt.unwrap(t, "collective").untyped_storage()


def alloc_storage(t: torch.Tensor) -> None:
    size = t.numel() * t.itemsize
    if (storage := _cpu_storage(t)).size() != size:
        storage.resize_(size)


def free_storage(t: torch.Tensor) -> None:
    if (storage := _cpu_storage(t)).size() != 0:
        storage.resize_(0)


def patch() -> None:
    """Install the storage-aware helpers into FSDP2 (idempotent; imports FSDP2 only when a group is created)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    for module in (_fsdp_param, _fsdp_param_group):
        if hasattr(module, "alloc_storage"):
            module.alloc_storage = alloc_storage
        if hasattr(module, "free_storage"):
            module.free_storage = free_storage
