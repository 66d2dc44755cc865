"""What the emulated device tells the runtime event log: op batches, host syncs, flushes, steps, memory.

Everything here is a no-op unless the log is on (``state.log_enabled``), so the per-op cost with profiling off
is one attribute read in the dispatcher. Step boundaries come from a global ``torch.optim`` step hook (every
training loop calls ``optimizer.step()``) or, when the user drives ``torch.profiler.profile.step()``, from that,
which then takes precedence.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import memory, state

op_counts: Counter[Any] = Counter()
_lock = threading.Lock()
_profiler_driven = False


def host_sync(op: str) -> None:
    """A device-to-host read the user asked for (any eager mode)."""
    if state.log_enabled:
        events.emit(events.HostSync, op=op, site=events.user_call_site(3))


def emit_op_batch() -> None:
    """Write the ops dispatched since the previous batch (at step ends and flushes)."""
    if not state.log_enabled or not op_counts:
        return
    with _lock:
        by_name = {str(op): n for op, n in op_counts.items()}
        op_counts.clear()
    events.emit(events.OpBatch, count=sum(by_name.values()), by_name=by_name)


#: Called with (op, user line) for every CPU fallback, whether or not the event log is on: what
#: ``torch_tpu._internal.utils.utils.OpTracer`` shows per op and line while it traces.
fallback_listeners: list[Callable[[str, events.Site | None], None]] = []


def emit_fallback(op: str) -> None:
    """An op the device runs on the host (TorchTPU's CPU fallback): into the event log and to the listeners."""
    if state.log_enabled or fallback_listeners:
        site = events.user_call_site(3)
        if state.log_enabled:
            events.emit(events.FallbackOp, op=op, site=site)
        for listener in list(fallback_listeners):
            listener(op, site)


def step_boundary(source: str) -> None:
    """End the current step and begin the next: op batch, memory sample, markers."""
    global _profiler_driven
    if source == "profiler":
        _profiler_driven = True
    elif _profiler_driven:
        return
    if not state.log_enabled:
        return
    log = events.get_log()
    emit_op_batch()
    allocated, peak = memory.take_step_peak()
    events.emit(events.MemorySample, allocated_bytes=allocated, peak_bytes=peak)
    events.emit(events.StepMarker, phase="end", source=source)
    log.step = (log.step or 0) + 1
    events.emit(events.StepMarker, phase="begin", source=source)


def _optimizer_post_hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    step_boundary("optimizer")


_installed = False


def install() -> None:
    """Open the log, start step 0 and hook optimizer and profiler steps (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    log = events.get_log()
    state.set_log_enabled(log.enabled)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_optimizer_post_hook)
    original_step = torch.profiler.profile.step

    def step(self: torch.profiler.profile) -> None:
        original_step(self)
        step_boundary("profiler")

    step.__doc__ = original_step.__doc__
    torch.profiler.profile.step = step
    if log.enabled:
        log.step = 0
        events.emit(events.StepMarker, phase="begin", source="annotation")
