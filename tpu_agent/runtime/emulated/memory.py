"""Device-memory accounting for the emulated ``tpu`` device (``torch.accelerator.memory_*``).

The emulation keeps every tpu tensor's data in a CPU tensor, so there is no device allocator to ask. Instead
each CPU storage that backs a tpu tensor is counted once, keyed by its base address, from the moment a tpu
tensor first wraps it until the last tpu tensor over it dies. That matches what a caching allocator reports as
``allocated_bytes`` closely enough for peak-memory diagnostics (views share their base's storage, so they are
free, as on a real device).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

_lock = threading.Lock()
_live: dict[int, list[int]] = {}  # storage base address -> [nbytes, number of tpu tensors over it]
allocated = 0
peak = 0
step_peak = 0  # peak since the last MemorySample
num_allocs = 0
num_frees = 0


def track(elem: Any) -> int:
    """Count ``elem``'s storage if no tpu tensor holds it yet; returns the key to pass to :func:`release`."""
    global allocated, peak, step_peak, num_allocs
    key = elem.data_ptr() - elem.storage_offset() * elem.element_size()
    entry = _live.get(key)
    if entry is not None:
        entry[1] += 1
        return key
    nbytes = elem.untyped_storage().nbytes()
    with _lock:
        _live[key] = [nbytes, 1]
        allocated += nbytes
        num_allocs += 1
        if allocated > peak:
            peak = allocated
        if allocated > step_peak:
            step_peak = allocated
    return key


def release(key: int) -> None:
    """One tpu tensor over the storage at ``key`` died; free the bytes when it was the last."""
    global allocated, num_frees
    with _lock:
        entry = _live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _live[key]
            allocated -= entry[0]
            num_frees += 1


def take_step_peak() -> tuple[int, int]:
    """Current bytes and the peak since the previous call (for the per-step MemorySample)."""
    global step_peak
    with _lock:
        result = (allocated, step_peak)
        step_peak = allocated
    return result


def reset_peak() -> None:
    global peak, step_peak
    with _lock:
        peak = allocated
        step_peak = allocated


def stats() -> OrderedDict[str, Any]:
    """The subset of the caching-allocator stat keys that ``torch.accelerator`` helpers read."""
    with _lock:
        values = {
            "allocated_bytes.all.current": allocated,
            "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": allocated,
            "reserved_bytes.all.peak": peak,
            "active_bytes.all.current": allocated,
            "active_bytes.all.peak": peak,
            "allocation.all.allocated": num_allocs,
            "allocation.all.freed": num_frees,
            "allocation.all.current": len(_live),
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }
    return OrderedDict(sorted(values.items()))
