"""Device-memory accounting for the emulated ``tpu`` device (``torch.accelerator.memory_*``).

The emulation keeps every tpu tensor's data in a CPU tensor, so there is no device allocator to ask. Instead
each CPU storage that backs a tpu tensor is counted once, keyed by its base address, from the moment a tpu
tensor first wraps it until the last CPU tensor that tpu tensors wrapped over it dies (a tpu tensor holds its
CPU tensor, so that is when the last tpu tensor over the storage dies). That matches what a caching allocator reports as
``allocated_bytes`` closely enough for peak-memory diagnostics (views share their base's storage, so they are
free, as on a real device).

The accounting is on the path of every op that makes a tensor, so it costs as little as it can there: tracking a
tensor appends one record (a weak reference, the storage's address and size) to an ordered event list, and a
tensor's death appends its weak reference to the same list (the callback is the list's ``append``: C code, no
Python call). The list is settled in order (counts, allocation, peaks) when the figures are read or when it grows
long; settling in order gives exactly the numbers an immediate count and release would have given.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

_lock = threading.Lock()
_live: dict[int, list[int]] = {}  # storage base address -> [nbytes, number of tracked tensors over it]
_holders: dict[int, tuple[weakref.ref, int]] = {}  # id(weak reference) -> (it, the storage key of its tensor)
# Unsettled events, in the order they happened: (weak reference, storage key, nbytes) when a tensor was tracked,
# the weak reference alone when that tensor died.
_events: list[Any] = []
_record = _events.append
SETTLE_EVERY = 2048  # events; bounds the memory the unsettled records hold
allocated = 0
peak = 0
step_peak = 0  # peak since the last MemorySample
num_allocs = 0
num_frees = 0


def track(elem: Any) -> None:
    """Count ``elem``'s storage (once, however many tracked tensors share it) until ``elem`` dies."""
    storage = elem.untyped_storage()
    _record((weakref.ref(elem, _record), storage.data_ptr(), storage.nbytes()))
    if len(_events) >= SETTLE_EVERY:
        with _lock:
            _settle()


def _settle() -> None:
    """Apply the unsettled events in order (the caller holds ``_lock``)."""
    global allocated, peak, step_peak, num_allocs, num_frees
    count = len(_events)
    batch = _events[:count]
    del _events[:count]  # events appended meanwhile (a tensor dying) stay, after these
    for event in batch:
        if type(event) is tuple:
            holder, key, nbytes = event
            _holders[id(holder)] = (holder, key)
            entry = _live.get(key)
            if entry is not None:
                entry[1] += 1
                continue
            _live[key] = [nbytes, 1]
            allocated += nbytes
            num_allocs += 1
            if allocated > peak:
                peak = allocated
            if allocated > step_peak:
                step_peak = allocated
            continue
        held = _holders.pop(id(event), None)
        if held is None:
            continue
        entry = _live.get(held[1])
        if entry is None:
            continue
        entry[1] -= 1
        if entry[1] <= 0:
            del _live[held[1]]
            allocated -= entry[0]
            num_frees += 1


def allocated_bytes() -> int:
    """Bytes of the storages that live tpu tensors hold now."""
    with _lock:
        _settle()
        return allocated


def take_step_peak() -> tuple[int, int]:
    """Current bytes and the peak since the previous call (for the per-step MemorySample)."""
    global step_peak
    with _lock:
        _settle()
        result = (allocated, step_peak)
        step_peak = allocated
    return result


def reset_peak() -> None:
    global peak, step_peak
    with _lock:
        _settle()
        peak = allocated
        step_peak = allocated


def stats() -> OrderedDict[str, Any]:
    """The subset of the caching-allocator stat keys that ``torch.accelerator`` helpers read."""
    with _lock:
        _settle()
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
