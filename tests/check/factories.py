"""Model factories for ``tpu-agent check MODULE:FUNCTION`` tests: each returns (model, inputs).

``wrong_forward`` and ``wrong_backward`` compute differently on the ``tpu`` device than on CPU in exactly one
layer (as a device-specific kernel bug would), so the localiser has a known right answer.
"""

from __future__ import annotations

import functools
import os
import random

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


class ClosesOverSubmodules(nn.Module):
    """minGPT's ``Block``: its forward calls a lambda that closes over submodules (``copy.deepcopy`` copies the
    lambda as itself, still calling the original's), a bound method of a submodule and a ``functools.partial``
    holding one."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(8, 16), "c_proj": nn.Linear(16, 8)})
        m = self.mlp
        self.mlpf = lambda x: m.c_proj(torch.relu(m.c_fc(x)))
        self.norm = nn.LayerNorm(8)
        self.normalise = self.norm.forward
        self.head = nn.Linear(8, 4)
        self.project = functools.partial(self.head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(self.normalise(x + self.mlpf(x)))


def closes_over_submodules() -> tuple[nn.Module, torch.Tensor]:
    return ClosesOverSubmodules(), torch.randn(2, 8)


class DrawnOutsideTorch(nn.Module):
    """State that a second construction does not reproduce: a parameter and a non-persistent buffer drawn from
    Python's unseeded ``random`` (``state_dict`` leaves the buffer out), and a buffer each forward advances."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.tensor([random.uniform(1.0, 2.0) for _ in range(8)]))
        self.register_buffer("shift", torch.tensor([random.uniform(-1.0, 1.0) for _ in range(8)]), persistent=False)
        self.register_buffer("calls", torch.zeros(()), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1  # each run of the model must start where the CPU reference started
        return self.proj(x) * self.scale + self.shift * self.calls


def drawn_outside_torch() -> tuple[nn.Module, torch.Tensor]:
    return DrawnOutsideTorch(), torch.randn(2, 8)


_built_once: list[nn.Module] = []


def builds_only_once() -> tuple[nn.Module, torch.Tensor]:
    """A factory that refuses a second call (as one registering a class by name would)."""
    if _built_once:
        raise RuntimeError("already built")
    _built_once.append(_mlp(nn.GELU()))
    return _built_once[0], torch.randn(4, 16)


_ONE_MODEL = _mlp(nn.Tanh())


def returns_one_model() -> tuple[nn.Module, torch.Tensor]:
    """The same model object on every call: building again gives no copy."""
    return _ONE_MODEL, torch.randn(4, 16)


class PlainTensorAttribute(nn.Module):
    """A tensor kept as a plain attribute, not a buffer: it stays on CPU when the model moves, a real error."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = torch.ones(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offset


def plain_tensor_attribute() -> tuple[nn.Module, torch.Tensor]:
    return _mlp(PlainTensorAttribute()), torch.randn(4, 16)


def not_a_pair() -> nn.Module:
    return nn.Linear(2, 2)


def raises() -> tuple[nn.Module, torch.Tensor]:
    raise ValueError("factory failed on purpose")


def crashes() -> tuple[nn.Module, torch.Tensor]:
    os.abort()  # a native crash, as a faulting kernel would: the worker process dies without a result
