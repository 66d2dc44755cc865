"""``torch.Generator("tpu")``: random-number generators for the emulated ``tpu`` device.

torch builds a device generator through the backend's C++ hooks (``getNewGenerator``), which a Python
PrivateUse1 backend cannot provide. The emulated device draws its random numbers from CPU kernels, which take
CPU generators; so a ``tpu`` generator is a CPU generator that reports ``device == tpu:0``. ``torch.Generator``
becomes a subclass that builds these for the ``tpu`` device and plain generators otherwise, and every
generator (including torch's own, built in C++) still passes ``isinstance(g, torch.Generator)``.

The device has its own default generator (:data:`default`), as CUDA and TorchTPU do: random ops on tpu tensors
draw from it (:func:`kernels.run_on_cpu`), so device dropout leaves the program's CPU stream (its data order)
where a CUDA run leaves it. ``torch.manual_seed`` seeds it through ``torch.tpu.manual_seed_all``; a fresh one
starts from torch's default seed, the CPU generator's, as CUDA's does.
"""

from __future__ import annotations

from typing import Any

import torch

_CGenerator: Any = torch._C.Generator  # typed Any: torch ships no stub for subclassing it


class _GeneratorType(type(_CGenerator)):  # type: ignore[misc]  # torch's opaque-object metaclass
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _CGenerator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _CGenerator)


class Generator(_CGenerator, metaclass=_GeneratorType):
    """``torch.Generator(device)`` that also accepts the emulated ``tpu`` device."""

    def __new__(cls, device: Any = "cpu") -> Generator:
        on_tpu = _is_tpu(device)
        self = super().__new__(cls, "cpu" if on_tpu else device)
        self._on_tpu = on_tpu
        return self

    def __init__(self, device: Any = "cpu") -> None:
        pass  # the C type initialises in __new__

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", 0) if self._on_tpu else super().device

    def __reduce__(self) -> Any:
        return (_rebuild, ("tpu" if self._on_tpu else str(super().device), self.get_state()))


def _rebuild(device: str, state: torch.Tensor) -> Generator:
    generator = Generator(device)
    generator.set_state(state)
    return generator


def _is_tpu(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "tpu"
    if isinstance(device, str):  # read without torch.device: :data:`default` is built before "tpu" parses
        return device.partition(":")[0] == "tpu"
    return False


default = Generator("tpu")  # the device's default generator: ``torch.tpu.default_generators[0]``


def install() -> None:
    """Make ``torch.Generator`` the emulation-aware subclass (once, at device registration), and seed the device
    generator as the CPU's was: a ``torch.manual_seed`` before activation applies to the device too, as one before
    CUDA's lazy initialisation does."""
    default.manual_seed(torch.initial_seed())
    Generator.__doc__ = _CGenerator.__doc__
    torch.Generator = Generator
