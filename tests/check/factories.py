"""Model factories for ``tpu-agent check MODULE:FUNCTION`` tests: each returns (model, inputs).

``wrong_forward`` and ``wrong_backward`` compute differently on the ``tpu`` device than on CPU in exactly one
layer (as a device-specific kernel bug would), so the localiser has a known right answer.
"""

from __future__ import annotations

import os

import torch
from torch import nn


class Scaled(nn.Module):
    """tanh, then (on tpu only) a 1% scale: a forward bug confined to this layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x)
        if y.device.type == "tpu":
            y = y * 1.01  # the deliberate device-only difference
        return y


class _GradOnTpuIsOff(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        if grad.device.type == "tpu":
            return grad * 1.5  # the deliberate device-only difference, in backward only
        return grad.clone()


class BadGradient(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GradOnTpuIsOff.apply(x)


def _mlp(middle: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), middle, nn.Linear(32, 8))


def good_mlp() -> tuple[nn.Module, torch.Tensor]:
    return _mlp(nn.GELU()), torch.randn(4, 16)


def keyword_inputs() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"out": self.proj(x) * scale, "argmax": self.proj(x).argmax(-1)}

    return TwoInputs(), {"x": torch.randn(3, 8), "scale": torch.rand(3, 1)}


def wrong_forward() -> tuple[nn.Module, torch.Tensor]:
    return _mlp(Scaled()), torch.randn(4, 16)


def wrong_backward() -> tuple[nn.Module, torch.Tensor]:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), BadGradient(), nn.Linear(32, 8)), torch.randn(4, 16)


class KeepsItsLastOutput(nn.Module):
    """Stores a non-leaf tensor from its forward (as recurrent models keep a state): such a module cannot be
    deep-copied after a forward, so the check must copy it before the CPU reference runs."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.last: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = self.proj(x)
        return torch.tanh(self.last)


def keeps_state() -> tuple[nn.Module, torch.Tensor]:
    return KeepsItsLastOutput(), torch.randn(2, 8)


def not_a_pair() -> nn.Module:
    return nn.Linear(2, 2)


def raises() -> tuple[nn.Module, torch.Tensor]:
    raise ValueError("factory failed on purpose")


def crashes() -> tuple[nn.Module, torch.Tensor]:
    os.abort()  # a native crash, as a faulting kernel would: the worker process dies without a result
