"""``torch.Generator("tpu")``: random-number generators for the emulated ``tpu`` device.

torch builds a device generator through the backend's C++ hooks (``getNewGenerator``), which a Python
PrivateUse1 backend cannot provide. The emulated device draws its random numbers from CPU kernels, which take
CPU generators; so a ``tpu`` generator is a CPU generator that reports ``device == tpu:0``. ``torch.Generator``
becomes a subclass that builds these for the ``tpu`` device and plain generators otherwise, and every
generator (including torch's own, built in C++) still passes ``isinstance(g, torch.Generator)``.

The device's default generator (:data:`default`) has the state a CUDA generator has: a 64-bit seed and a 64-bit
offset, 16 bytes (Philox's counter). torch code written for accelerators reads and writes that layout through the
device module's ``get_rng_state``/``set_rng_state``: DTensor gives each shard of a random tensor its own offset
(FSDP2's meta-device initialisation draws every parameter that way). Each op draws from a CPU engine seeded with
a mix of the pair and then moves the offset past the numbers it drew, so those 16 bytes are the whole state:
restoring them replays. A generator the program makes itself (``torch.Generator("tpu")``) reaches the CPU kernels
as torch's own C++ object (torch re-wraps it on the way through the dispatcher), so it keeps a CPU generator's
state.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import torch

_CGenerator: Any = torch._C.Generator  # typed Any: torch ships no stub for subclassing it
_STATE = struct.Struct("<QQ")  # seed, offset: the layout of a CUDA generator's (Philox) state
_MASK = (1 << 64) - 1
_DEFAULT_SEED = 67280421310721  # torch's default seed, as a new CUDA generator has


class _GeneratorType(type(_CGenerator)):  # type: ignore[misc]  # torch's opaque-object metaclass
    """``torch.Generator`` (this module's :class:`Generator`) stands for every generator, torch's own included."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _CGenerator) if cls is Generator else super().__instancecheck__(obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _CGenerator) if cls is Generator else super().__subclasscheck__(sub)


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


class DeviceDefaultGenerator(Generator):
    """The device's default generator (``torch.tpu.default_generators[0]``), whose state is a CUDA generator's:
    (seed, offset), 16 bytes. Random ops that name no generator draw from it through :func:`kernels.run_on_cpu`,
    which reseeds the engine before each op and advances the offset after it."""

    def __new__(cls, device: Any = "tpu") -> DeviceDefaultGenerator:
        self = super().__new__(cls, device)
        self._seed, self._offset = _DEFAULT_SEED, 0
        return self

    def manual_seed(self, seed: int) -> DeviceDefaultGenerator:
        self._seed, self._offset = int(seed) & _MASK, 0  # torch takes negative seeds as their 64-bit pattern
        return self

    def seed(self) -> int:
        value = int.from_bytes(os.urandom(8), "little") >> 1  # non-deterministic, as torch's: a 63-bit seed
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(_STATE.pack(self._seed, self._offset)), dtype=torch.uint8)

    def set_state(self, new_state: torch.Tensor) -> DeviceDefaultGenerator:
        data = new_state.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
        if len(data) != _STATE.size:
            raise ValueError(
                f"the tpu generator's state is {_STATE.size} bytes (seed, offset), got {len(data)}: pass a state "
                "torch.tpu.get_rng_state_all() returned"
            )
        self._seed, self._offset = _STATE.unpack(data)
        return self

    def reseed_engine(self, engine: Any = None) -> None:
        """Seed ``engine`` (this generator's own CPU engine when None) for the next op's draws from (seed, offset)."""
        _CGenerator.manual_seed(self if engine is None else engine, _mix(self._seed, self._offset))

    def advance(self, count: int) -> None:
        """Move the offset past ``count`` numbers, in Philox's steps of four."""
        self._offset = (self._offset + (count + 3) // 4 * 4) & _MASK

    def next_seed(self) -> int:
        """A 31-bit seed for a program that draws with its own PRNG (an XLA executable), as one draw of four."""
        value = _mix(self._seed, self._offset) >> 33
        self.advance(4)
        return value

    def __reduce__(self) -> Any:
        return (_rebuild_default, (self.get_state(),))


def _rebuild_default(state: torch.Tensor) -> DeviceDefaultGenerator:
    return DeviceDefaultGenerator().set_state(state)


def _mix(seed: int, offset: int) -> int:
    """A 64-bit engine seed from a (seed, offset) pair: splitmix64's finaliser, so nearby pairs seed unrelated
    streams."""
    z = (seed + (offset + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


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


default = DeviceDefaultGenerator()  # ``torch.tpu.default_generators[0]``


def install() -> None:
    """Make ``torch.Generator`` the emulation-aware subclass (once, at device registration), and seed the device
    generator as the CPU's was: a ``torch.manual_seed`` before activation applies to the device too, as one before
    CUDA's lazy initialisation does."""
    default.manual_seed(torch.initial_seed())
    Generator.__doc__ = _CGenerator.__doc__
    torch.Generator = Generator
