"""The XLA executable cache: one compiled executable per graph signature, input shapes/dtypes and precision.

A steady training loop compiles each distinct graph once, as TorchTPU does; later calls are hits. The cache
is bounded (least recently used entries go first) because a program whose shapes keep changing would
otherwise hold every executable it ever built. Each compilation is written to the event log as a
:class:`~tpu_agent.runtime.events.Compile` record (a new shape or precision for a known graph counts as a
recompile), so the profiler's compile rules see XLA compilations as they see Dynamo's; each hit is a
:class:`~tpu_agent.runtime.events.CacheHit` record. Both are also what ``torch.tpu._get_cache_stats()`` counts
(:mod:`~tpu_agent.runtime.emulated.compile_cache`), with XLA's real compile time per entry.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import compile_cache, state

MAX_EXECUTABLES = 256


@dataclass
class CacheStats:
    requests: int = 0
    hits: int = 0
    compiles: int = 0
    evictions: int = 0
    compile_ns: int = 0


class ExecutableCache:
    """LRU map from (signature, shapes, precision) to compiled executables, with counters."""

    def __init__(self, capacity: int = MAX_EXECUTABLES) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._signatures: dict[Hashable, int] = {}
        self._lock = threading.RLock()
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_compile(
        self,
        signature: Hashable,
        specialisation: Hashable,
        build: Callable[[], Any],
        function: str,
        site: events.Site | None,
        graph_ops: Callable[[], int],
    ) -> Any:
        """The executable for ``signature`` at ``specialisation`` (shapes, dtypes, precision), built on a miss.

        ``function`` and ``site`` name the graph in the event records; ``graph_ops`` counts its ops for a
        Compile record (only on a miss: counting walks the graph)."""
        key = (signature, specialisation)
        with self._lock:
            self.stats.requests += 1
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
        if entry is not None:
            compile_cache.record_hit(key)
            if state.log_enabled:
                events.emit(events.CacheHit, function=function, site=site)
            return entry
        start = time.perf_counter_ns()
        entry = build()
        duration = time.perf_counter_ns() - start
        with self._lock:
            self._entries[key] = entry
            if len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
                self.stats.evictions += 1
            self.stats.compiles += 1
            self.stats.compile_ns += duration
            compile_cache.record_build(key, duration)
            seen = self._signatures.get(signature, 0)
            self._signatures[signature] = seen + 1
        if state.log_enabled:
            events.emit(
                events.Compile,
                function=function,
                graph_id=seen,
                graph_ops=graph_ops(),
                is_recompile=seen > 0,
                reason="first call" if seen == 0 else f"new input shapes, dtypes or precision: {specialisation}"[:500],
                duration_ns=duration,
                site=site,
            )
        return entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._signatures.clear()


executables = ExecutableCache()
