"""What ``torch.tpu._get_cache_stats()`` counts: requests for the executables the emulation really builds.

TorchTPU keeps one compiled executable per fingerprint (the op or graph, input shapes, dtypes, scalar values)
and counts every request for one, every hit, and per entry its reads and compile time; vLLM's TorchTPU backend
reads these counters each step to notice recompiles. The emulation counts the same events for its own units of
execution:

* **Strict** (and Debug) eager: one request per dispatched op that computes (views and host transfers build
  nothing), keyed by the op and its arguments' layouts and non-float values (:func:`shape_cache.key_of`); each
  op runs as its CPU kernel, so its compile time is 0.
* **DeferAndFuse**: one request per flushed graph, keyed by the graph's hash (the recorded op sequence with its
  inputs' layouts); op by op its compile time is 0, under ``--compiler xla`` it is XLA's real compile.
* **torch.compile**: one request per call of a compiled graph; its compile time is the backend's (Dynamo builds a
  new graph for new shapes, so a new shape is a miss). Ops inside a compiled graph, and those Dynamo runs on fake
  data while it traces, are not counted again. Op by op, a compiled function's backward is eager autograd, so
  its ops count as Strict ops (each a hit in a steady loop) where TorchTPU would count one backward executable.

Every key includes ``allow_excess_precision``: TorchTPU compiles anew when it changes. Under ``--compiler xla``
the XLA executable cache (whose keys include it too) reports its own lookups here (:func:`record_hit` /
:func:`record_build`), so graphs it compiles count once. Entries are bounded like
the shape cache (oldest built out); the counters are not. The hot path takes no lock: the GIL keeps each update whole.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any, NamedTuple

import torch

from tpu_agent.runtime.emulated import state

MAX_ENTRIES = 8192


class CacheEntryStats(NamedTuple):
    """One executable: reads after its build, its compile time (µs) and when it was last read (µs since the epoch,
    0 before any read)."""

    read_count: int
    compilation_duration: int
    last_read: int


class CacheStats(NamedTuple):
    """``torch.tpu._get_cache_stats()``: requests, hits and one :class:`CacheEntryStats` per kept executable."""

    num_cache_reqs: int
    num_cache_hits: int
    per_entry_stats: list[CacheEntryStats]


class _Entry:
    __slots__ = ("read_count", "compilation_duration", "last_read")

    def __init__(self, compile_us: int) -> None:
        self.read_count = 0
        self.compilation_duration = compile_us
        self.last_read = 0


_entries: dict[Hashable, _Entry] = {}
requests = 0
hits = 0
_inside_graph = 0  # > 0 while a compiled graph runs: its ops are part of that graph's executable


def request(key: Hashable, compile_ns: int = 0) -> None:
    """A request for ``key``'s executable: a hit if it was built before, else a miss that builds it (taking
    ``compile_ns``)."""
    global requests, hits
    key = (key, state.allow_excess_precision)  # TorchTPU compiles anew when the setting changes
    try:
        entry = _entries.get(key)
    except TypeError:  # an argument that cannot be hashed: no key, so no count rather than a wrong one
        return
    requests += 1
    if entry is None:
        _build(key, compile_ns)
        return
    hits += 1
    entry.read_count += 1
    entry.last_read = time.time_ns() // 1000


def _build(key: Hashable, compile_ns: int) -> None:
    """Enter ``key``'s executable; past MAX_ENTRIES the oldest built goes (a plain dict: per-op cost matters more
    than LRU). Another thread (autograd's) may evict at the same moment: whichever loses finds nothing to drop."""
    _entries[key] = _Entry(compile_ns // 1000)
    if len(_entries) > MAX_ENTRIES:
        with contextlib.suppress(RuntimeError, StopIteration):  # the dict changed under iteration
            _entries.pop(next(iter(_entries)), None)


def record_hit(key: Hashable) -> None:
    """A request that found ``key``'s executable in the caller's own cache (a hit even when this table has
    already let the entry go)."""
    global requests, hits
    requests += 1
    hits += 1
    entry = _entries.get((key, state.allow_excess_precision))
    if entry is not None:
        entry.read_count += 1
        entry.last_read = time.time_ns() // 1000


def record_build(key: Hashable, compile_ns: int) -> None:
    """A request that missed: ``key``'s executable was built, in ``compile_ns``."""
    global requests
    requests += 1
    _build((key, state.allow_excess_precision), compile_ns)


# How a Strict op is keyed: the shape cache's signature of the call (its arguments' layouts and non-float values).
# Handed in when the device is registered (device.register) rather than imported: the shape cache sits above the
# dispatcher, which calls here.
op_key: Callable[[Any, tuple, dict], Hashable] | None = None


def set_op_key(key_of: Callable[[Any, tuple, dict], Hashable]) -> None:
    """Key Strict ops' executables by ``key_of`` (the shape cache's :func:`shape_cache.key_of`)."""
    global op_key
    op_key = key_of


def request_op(func: Any, args: tuple, kwargs: dict) -> None:
    """Strict mode's request for one op's executable: not while a compiled graph runs the op, nor while torch.compile
    traces it (on fake data)."""
    if _inside_graph or torch.compiler.is_compiling():
        return
    key = op_key(func, args, kwargs) if op_key is not None else None
    if key is not None:  # None: a call the signature cannot key (a Generator argument); counting it would miskey
        request((id(func), key))  # by id: an OpOverload hashes in Python, microseconds


@contextlib.contextmanager
def graph_running() -> Iterator[None]:
    """While a compiled graph runs: its ops are that graph's, not requests of their own."""
    global _inside_graph
    _inside_graph += 1
    try:
        yield
    finally:
        _inside_graph -= 1


def stats() -> CacheStats:
    return CacheStats(
        requests,
        hits,
        [CacheEntryStats(e.read_count, e.compilation_duration, e.last_read) for e in list(_entries.values())],
    )


def clear() -> None:
    """``torch.tpu._clear_cache()``: forget every executable (the next request for each is a miss again)."""
    _entries.clear()


def executables() -> int:
    return len(_entries)
