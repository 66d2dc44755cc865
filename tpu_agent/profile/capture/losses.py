"""The first steps' losses: what the script called ``backward()`` on, read once the script is done.

Verification (:mod:`tpu_agent.profile.verify`) compares them between the user's run and a patched copy: a fix must
not change the model's numbers. The value is held as a detached tensor and read at exit, so recording costs one
``detach`` per step and no device-to-host read inside the measured window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tpu_agent.profile.capture._probe import Probe

LOSS_STEPS = 3  # losses kept: the first steps, before optimizer state or data order can amplify a difference


class LossProbe(Probe):
    """Wraps ``torch.Tensor.backward`` to keep the first :data:`LOSS_STEPS` scalar losses."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Any] = []

    def install(self) -> None:
        import torch

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                if len(self.kept) < LOSS_STEPS and tensor.numel() == 1 and not tensor.is_meta:  # meta: no value
                    self.kept.append(tensor.detach())
                return original(tensor, *args, **kwargs)

            return backward

        self.patch(torch.Tensor, "backward", make)

    def record(self) -> dict[str, Any]:
        losses = []
        for value in self.kept:
            try:
                number = float(value.float().cpu().reshape(()).item())
            except RuntimeError:  # a value that cannot be read (a placeholder): no losses rather than no capture
                return {"losses": [], "warnings": ["the losses could not be read: verification compares none"]}
            losses.append(number if math.isfinite(number) else str(number))  # JSON has no NaN
        return {"losses": losses}
