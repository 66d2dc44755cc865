"""Backward passes run on the calling thread's ready queue, so ``activate()`` may come after CPU autograd.

torch's autograd engine sizes its per-device worker queues once per process, at the first backward, from the
device types registered then. A notebook that runs any CPU backward before ``activate()`` leaves no queue for
the ``tpu`` device, and every later ``tpu`` backward fails with torch's internal assert on
``device_ready_queues_``. The emulated device computes on the host anyway, so its backward runs where CPU
backward runs: the engine's multithreading switch (thread-local, hence set around each backward call rather
than once) routes every node to the calling thread's queue, whatever the engine sized at its start.

A Python error raised beneath a backward node is taken by :class:`.device_guard.DeviceGuard` so that the engine
does not abort; the wrapper raises it in place of the engine's empty error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd

from tpu_agent.runtime.emulated import device_guard


def _on_calling_thread(run_backward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run_backward)
    def run(*args: Any, **kwargs: Any) -> Any:
        device_guard.take_error()  # one taken outside a backward is not this backward's
        with torch.autograd.set_multithreading_enabled(False):
            try:
                return run_backward(*args, **kwargs)
            except Exception:
                taken = device_guard.take_error()
                if taken is None:
                    raise
        raise taken  # the node's own error, in place of the engine's "returned NULL without setting an exception"

    run.__emulated_queue__ = True  # type: ignore[attr-defined]  # marks it wrapped (install is idempotent)
    return run


def install() -> None:
    """Route ``backward()``/``torch.autograd.grad`` (both call ``torch.autograd._engine_run_backward``)."""
    current = torch.autograd._engine_run_backward
    if not hasattr(current, "__emulated_queue__"):
        torch.autograd._engine_run_backward = _on_calling_thread(current)
