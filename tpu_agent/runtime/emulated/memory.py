"""Device-memory accounting for the emulated ``tpu`` device (``torch.accelerator.memory_*``).

The emulation keeps every tpu tensor's data in a CPU tensor, so there is no device allocator to ask. Instead
each CPU storage that backs a tpu tensor is counted once, from the moment a tpu tensor first wraps it until the
storage is freed. That matches what a caching allocator reports as ``allocated_bytes`` closely enough for
peak-memory diagnostics (views share their base's storage, so they are free, as on a real device).

The accounting is on the path of every op that makes a tensor, so it costs as little as it can there. torch
keeps one Python object per storage for the storage's whole life, so the storage itself carries the mark that
it is counted (views and in-place results cost one lookup), and its death is seen through a weak reference
whose callback is a list's ``append`` (C code, no Python call). Counting a new storage and seeing one die both
append to one ordered event list, settled in order (allocation, peaks) when the figures are read or when it
grows long; settling in order gives exactly the numbers an immediate count and release would have given.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

_lock = threading.Lock()
_COUNTED = "_tpu_agent_counted"  # the mark a counted storage carries in its __dict__
# id(weak reference to a counted storage) -> (that reference, kept alive so its callback fires; the storage's
# nbytes), once settled
_live: dict[int, tuple[weakref.ref, int]] = {}
# Unsettled events, in the order they happened: (weak reference, nbytes) when a storage was first counted, the
# weak reference alone when that storage was freed.
_events: list[Any] = []
_record = _events.append
SETTLE_EVERY = 2048  # events; bounds the memory the unsettled records hold
allocated = 0
peak = 0
step_peak = 0  # peak since the last MemorySample
num_allocs = 0
num_frees = 0


def track(elem: Any) -> None:
    """Count ``elem``'s storage (once, however many tracked tensors share it) until the storage is freed."""
    storage = elem.untyped_storage()
    marks = storage.__dict__
    if _COUNTED in marks:
        return
    marks[_COUNTED] = True
    _record((weakref.ref(storage, _record), storage.nbytes()))
    if len(_events) >= SETTLE_EVERY:
        with _lock:
            _settle()


def _settle() -> None:
    """Apply the unsettled events in order (the caller holds ``_lock``)."""
    global allocated, peak, step_peak, num_allocs, num_frees
    count = len(_events)
    batch = _events[:count]
    del _events[:count]  # events appended meanwhile (a storage freed) stay, after these
    for event in batch:
        if type(event) is tuple:
            holder, nbytes = event
            _live[id(holder)] = (holder, nbytes)
            allocated += nbytes
            num_allocs += 1
            if allocated > peak:
                peak = allocated
            if allocated > step_peak:
                step_peak = allocated
            continue
        entry = _live.pop(id(event), None)
        if entry is not None:
            allocated -= entry[1]
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
