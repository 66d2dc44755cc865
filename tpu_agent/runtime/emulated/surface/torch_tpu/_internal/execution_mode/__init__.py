"""``torch_tpu._internal.execution_mode``: the eager mode as an assignable module property, and a scoped switch.

``EagerMode`` is the emulation's own enum (the same object as ``torch.tpu.EagerMode``); assigning ``eager_mode``
here or on ``torch.tpu`` switches the one process-wide mode the emulated dispatcher uses
(:func:`tpu_agent.runtime.emulated.modes.apply_mode`). ``set_eager_mode`` restores the previous mode even when
the block raises, and is forbidden inside ``torch.compile`` as TorchTPU's is.

As in the 0.2.0 wheel, ``eager_mode`` is a property (``em.eager_mode = X`` switches, reading it gives the
``EagerMode`` member). TorchTPU's guide also writes the scoped switch as a call, ``with em.eager_mode(X):`` (its
deferred_execution and error_glossary pages, and the API before 0.2.0); where the wheel raises ``TypeError`` for
that, the emulation accepts it as ``with em.set_eager_mode(X):`` (every ``EagerMode`` member is callable so;
:func:`tpu_agent.runtime.emulated.modes._scoped_by_call`), so the guide's code runs as written.
"""

from __future__ import annotations

import contextlib
import sys

from tpu_agent.runtime.emulated import modes
from tpu_agent.runtime.emulated.state import EagerMode


class _ExecutionModeModule(modes.ExecutionSettings):
    """This module, with ``eager_mode`` and ``enable_cpu_fallback`` as properties over the emulation's state."""


def set_eager_mode(mode: EagerMode) -> contextlib.AbstractContextManager[None]:
    """Scoped eager mode (looked up at call time: the runtime swaps in the compile-forbidden version)."""
    return modes.set_eager_mode(mode)


sys.modules[__name__].__class__ = _ExecutionModeModule

__all__ = ["EagerMode", "eager_mode", "enable_cpu_fallback", "set_eager_mode"]  # two are module properties
GUIDE_PAGE = "eager_mode"  # the TorchTPU notebook that documents this module (read by tpu_lookup_api)
