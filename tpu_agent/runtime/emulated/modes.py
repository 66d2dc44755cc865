"""Switching eager modes and matmul precision (``torch.tpu.eager_mode``, ``set_eager_mode``, ``precision``).

Changing the mode swaps the dispatcher function the tensor type calls, so Strict pays nothing for the other
modes. Leaving DeferAndFuse first runs the pending graph: work recorded under one mode never executes under
another's rules.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

from tpu_agent.runtime.emulated import state
from tpu_agent.runtime.emulated.flush_cause import FlushCause
from tpu_agent.runtime.emulated.state import EagerMode, Precision


def apply_mode(mode: EagerMode) -> None:
    """Make ``mode`` the process-wide eager mode."""
    from tpu_agent.runtime.emulated import deferred, dispatch, tensor

    if state.eager_mode in state.DEFERRING_MODES and mode not in state.DEFERRING_MODES:
        deferred.flush(FlushCause.MODE_CHANGE)
    state.use_eager_mode(mode)
    tensor.set_pending_graph(deferred.touches, deferred.flush)
    tensor.set_dispatcher(deferred.record if mode in state.DEFERRING_MODES else dispatch.strict_dispatch)


class ExecutionSettings(types.ModuleType):
    """A module whose ``eager_mode`` and ``enable_cpu_fallback`` are properties over the process's settings.

    TorchTPU exposes the same two settings as assignable attributes of two modules, ``torch.tpu`` and
    ``torch_tpu._internal.execution_mode``; both modules of the emulation derive from this class, so an
    assignment through either switches the one process-wide mode the dispatcher uses.
    """

    @property
    def eager_mode(self) -> EagerMode:
        return state.eager_mode

    @eager_mode.setter
    def eager_mode(self, mode: EagerMode) -> None:
        apply_mode(state.parse_eager_mode(mode))

    @property
    def enable_cpu_fallback(self) -> bool:
        return state.cpu_fallback

    @enable_cpu_fallback.setter
    def enable_cpu_fallback(self, value: bool) -> None:
        state.set_cpu_fallback(bool(value))


@contextlib.contextmanager
def set_eager_mode(mode: EagerMode) -> Iterator[None]:
    """Scoped eager mode; the previous mode comes back even when the block raises (forbidden under compile)."""
    previous = state.eager_mode
    apply_mode(state.parse_eager_mode(mode))
    try:
        yield
    finally:
        apply_mode(previous)


@contextlib.contextmanager
def precision(mode: Precision) -> Iterator[None]:
    """``torch.tpu.precision(...)``: overrides the global f32 matmul precision inside the block."""
    if not isinstance(mode, Precision):
        raise ValueError(f"precision must be a torch.tpu.Precision value (DEFAULT, HIGH, HIGHEST), got {mode!r}")
    state.precision_stack.append(mode)
    try:
        yield
    finally:
        state.precision_stack.pop()


def set_float32_matmul_precision(name: str) -> None:
    """TorchTPU's remap: medium -> DEFAULT (1-pass bf16), high -> HIGH, highest -> HIGHEST (reference §6.2)."""
    try:
        state.set_precision(state.PRECISION_BY_TORCH_NAME[name])
    except KeyError:
        raise ValueError(f"Invalid precision {name!r}; expected one of 'medium', 'high', 'highest'") from None


def get_float32_matmul_precision() -> str:
    return state.TORCH_NAME_BY_PRECISION[state.precision]
