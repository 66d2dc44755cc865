"""Device-memory accounting for the emulated ``tpu`` device (``torch.accelerator.memory_*``).

The emulation keeps every tpu tensor's data in a CPU tensor, so there is no device allocator to ask. Instead
each CPU storage that backs a tpu tensor is counted once, keyed by its base address, from the moment a tpu
tensor first wraps it until the last CPU tensor that tpu tensors wrapped over it dies (a tpu tensor holds its
CPU tensor, so that is when the last tpu tensor over the storage dies). That matches what a caching allocator reports as
``allocated_bytes`` closely enough for peak-memory diagnostics (views share their base's storage, so they are
free, as on a real device).

The accounting is on the path of every op that makes a tensor, so it costs no Python call when a tensor dies:
each tracked CPU tensor gets a weak reference whose callback is a list's ``append`` (C code), and the storages
of dead tensors are released in a batch at the next allocation or read of the figures, which sees the same
numbers an immediate release would have given.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

_lock = threading.Lock()
_live: dict[int, list[int]] = {}  # storage base address -> [nbytes, number of tracked tensors over it]
_holders: dict[int, tuple[weakref.ref, int]] = {}  # id(weak reference) -> (it, the storage key of its tensor)
_dead: list[weakref.ref] = []  # weak references whose tensors died; released by _release_dead
allocated = 0
peak = 0
step_peak = 0  # peak since the last MemorySample
num_allocs = 0
num_frees = 0


def track(elem: Any) -> None:
    """Count ``elem``'s storage (once, however many tracked tensors share it) until ``elem`` dies."""
    global allocated, peak, step_peak, num_allocs
    key = elem.data_ptr() - elem.storage_offset() * elem.element_size()
    holder = weakref.ref(elem, _dead.append)
    with _lock:
        if _dead:
            _release_dead()
        _holders[id(holder)] = (holder, key)
        entry = _live.get(key)
        if entry is not None:
            entry[1] += 1
            return
        nbytes = elem.untyped_storage().nbytes()
        _live[key] = [nbytes, 1]
        allocated += nbytes
        num_allocs += 1
        if allocated > peak:
            peak = allocated
        if allocated > step_peak:
            step_peak = allocated


def _release_dead() -> None:
    """Release the storages of tensors that died since the last call (the caller holds ``_lock``)."""
    global allocated, num_frees
    while _dead:
        holder = _dead.pop()  # atomic: a tensor dying meanwhile appends, and this loop takes it too
        _, key = _holders.pop(id(holder))
        entry = _live.get(key)
        if entry is None:
            continue
        entry[1] -= 1
        if entry[1] <= 0:
            del _live[key]
            allocated -= entry[0]
            num_frees += 1


def allocated_bytes() -> int:
    """Bytes of the storages that live tpu tensors hold now."""
    with _lock:
        _release_dead()
        return allocated


def take_step_peak() -> tuple[int, int]:
    """Current bytes and the peak since the previous call (for the per-step MemorySample)."""
    global step_peak
    with _lock:
        _release_dead()
        result = (allocated, step_peak)
        step_peak = allocated
    return result


def reset_peak() -> None:
    global peak, step_peak
    with _lock:
        _release_dead()
        peak = allocated
        step_peak = allocated


def stats() -> OrderedDict[str, Any]:
    """The subset of the caching-allocator stat keys that ``torch.accelerator`` helpers read."""
    with _lock:
        _release_dead()
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
