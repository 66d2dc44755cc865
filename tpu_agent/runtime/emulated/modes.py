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
        """The process-wide eager mode: assigning an ``EagerMode`` switches it, reading gives the member, and calling
        that (``with em.eager_mode(X):``, as TorchTPU's guide writes it) scopes a mode as ``set_eager_mode`` does."""
        return state.eager_mode

    @eager_mode.setter
    def eager_mode(self, mode: EagerMode) -> None:
        apply_mode(state.parse_eager_mode(mode))

    @property
    def enable_cpu_fallback(self) -> bool:
        """Whether an op the device has no kernel for runs on the CPU instead of raising ``NotImplementedError``."""
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


def _scoped_by_call(_current: EagerMode, mode: EagerMode) -> contextlib.AbstractContextManager[None]:
    """``with em.eager_mode(X):``, as TorchTPU's deferred_execution and error_glossary guide pages write it.

    The 0.2.0 wheel made ``eager_mode`` an assignable property, so the value read from it is called: making every
    ``EagerMode`` callable as the scoped switch keeps the three documented forms working at once (assigning,
    reading, which still gives the enum member itself, and calling). The call is ``set_eager_mode``, looked up
    when called, so it is forbidden inside ``torch.compile`` as that is."""
    return set_eager_mode(mode)


setattr(EagerMode, "__call__", _scoped_by_call)  # noqa: B010 (mypy rejects assigning a method to the class)


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
