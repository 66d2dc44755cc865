"""Device-to-host reads (``.item()``, ``.cpu()``, ``bool(t)``, ``print(t)``, ...) made by the user's own lines.

Only installed where the emulated device is not active: the emulated ``tpu`` device reports its host syncs
itself, from inside the tensor, at no extra cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpu_agent.profile.capture._probe import Probe, direct_caller_is_user
from tpu_agent.profile.capture.steps import StepClock
from tpu_agent.runtime import events as ev

# Tensor method -> the name a HostSync record gives the read.
SYNC_METHODS = {
    "item": "item",
    "tolist": "tolist",
    "numpy": "numpy",
    "cpu": "cpu",
    "__bool__": "bool",
    "__float__": "float",
    "__int__": "int",
    "__repr__": "print",
    "__format__": "print",
}


class HostSyncProbe(Probe):
    def __init__(self, clock: StepClock) -> None:
        super().__init__()
        self.clock = clock

    def install(self) -> None:
        import torch

        for method, op in SYNC_METHODS.items():
            self.patch(torch.Tensor, method, self._wrapper_for(op))

    def _wrapper_for(self, op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        import torch

        log = self.clock.log
        is_compiling = torch.compiler.is_compiling

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                if log.step is not None and not is_compiling() and direct_caller_is_user(1):
                    ev.emit(ev.HostSync, op=op, site=ev.user_call_site(2))
                return original(tensor, *args, **kwargs)

            wrapper.__name__ = original.__name__
            return wrapper

        return make
