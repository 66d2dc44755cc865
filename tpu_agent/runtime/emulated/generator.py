"""``torch.Generator("tpu")``: random-number generators for the emulated ``tpu`` device.

torch builds a device generator through the backend's C++ hooks (``getNewGenerator``), which a Python
PrivateUse1 backend cannot provide, so ``torch.Generator`` becomes a subclass that builds a :class:`DeviceGenerator`
for the ``tpu`` device and torch's own generator for any other; every generator (torch's included) still passes
``isinstance(g, torch.Generator)``.

A :class:`DeviceGenerator` has the state a CUDA generator has: a 64-bit seed and a 64-bit offset, 16 bytes
(Philox's counter). torch code written for accelerators reads and writes that layout: DTensor gives each shard of
a random tensor its own offset (FSDP2's meta-device initialisation draws every parameter that way),
``torch.random.fork_rng`` and checkpointing code save and restore it. The device's default generator
(:data:`default`, ``torch.tpu.default_generators[0]``) and the ones a program makes are the same class, so a
state saved from one loads into the other. The numbers themselves come from CPU kernels: a device generator is
also a CPU engine (torch's C++ CPU generator underneath), which :mod:`kernels` seeds with a mix of (seed, offset)
before each op and whose offset it moves past the numbers the op drew. So those 16 bytes are the whole state:
restoring them replays, and no draw touches the CPU's own stream.

A generator argument does not reach the kernels as the object the program passed: the dispatcher hands
``__torch_dispatch__`` a new ``torch._C.Generator`` over the same C++ generator (torch reuses a Python object
only for a generator it wrapped itself, and its constructor registers none). The C++ generator's
address (``_cdata``) is what survives, so :func:`device_generator_of` finds the :class:`DeviceGenerator` by it.

Random ops draw when they run, which under DeferAndFuse is at the next flush: reading, seeding or restoring a
device generator first runs the pending graph, so the ops issued before the call get the stream before it
(``torch.utils.checkpoint`` saves the state, then replays the forward's dropout).
"""

from __future__ import annotations

import os
import struct
import weakref
from collections.abc import Callable
from typing import Any

import torch

from tpu_agent.runtime.emulated.flush_cause import FlushCause

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

    def __new__(cls, device: Any = "cpu") -> Any:
        if _is_tpu(device):
            return DeviceGenerator()
        return _CGenerator(device)  # torch's own, pickled and used as without the emulation

    def __init__(self, device: Any = "cpu") -> None:
        pass  # the C type initialises in __new__


class DeviceGenerator(Generator):
    """A ``tpu`` generator, whose state is a CUDA generator's: (seed, offset), 16 bytes."""

    _seed: int
    _offset: int

    def __new__(cls, device: Any = "tpu") -> DeviceGenerator:
        self = _CGenerator.__new__(cls, "cpu")  # its engine: a CPU generator
        self._seed, self._offset = _DEFAULT_SEED, 0
        _BY_ENGINE[self._cdata] = self
        return self

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", 0)

    def manual_seed(self, seed: int) -> DeviceGenerator:
        _settle()
        self._seed, self._offset = int(seed) & _MASK, 0  # torch takes negative seeds as their 64-bit pattern
        return self

    def seed(self) -> int:
        value = int.from_bytes(os.urandom(8), "little") >> 1  # non-deterministic, as torch's: a 63-bit seed
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        return self._seed

    def get_offset(self) -> int:
        _settle()
        return self._offset

    def set_offset(self, offset: int) -> DeviceGenerator:
        _settle()
        self._offset = int(offset) & _MASK
        return self

    def get_state(self) -> torch.Tensor:
        _settle()
        return torch.frombuffer(bytearray(_STATE.pack(self._seed, self._offset)), dtype=torch.uint8)

    def set_state(self, new_state: torch.Tensor) -> DeviceGenerator:
        data = new_state.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
        if len(data) != _STATE.size:
            raise ValueError(
                f"the tpu generator's state is {_STATE.size} bytes (seed, offset), got {len(data)}: pass a state "
                "a tpu generator's get_state() or torch.tpu.get_rng_state_all() returned"
            )
        _settle()
        self._seed, self._offset = _STATE.unpack(data)
        return self

    def clone_state(self) -> DeviceGenerator:
        """A new generator at this one's state (AOTAutograd's RNG functionalisation clones the default)."""
        return DeviceGenerator().set_state(self.get_state())

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
        return (_rebuild, (self.get_state(),))


# Every live device generator by its engine's C++ address: how a generator argument finds its device generator.
_BY_ENGINE: weakref.WeakValueDictionary[int, DeviceGenerator] = weakref.WeakValueDictionary()


def device_generator_of(g: Any) -> DeviceGenerator | None:
    """The :class:`DeviceGenerator` that ``g`` is or wraps (see the module docstring), None for a CPU generator."""
    return g if type(g) is DeviceGenerator else _BY_ENGINE.get(g._cdata)


def _rebuild(state: torch.Tensor) -> DeviceGenerator:
    return DeviceGenerator().set_state(state)


def _no_pending_graph(cause: FlushCause) -> None:
    """Before :func:`install`, no op can have been recorded."""


# DeferAndFuse's flush, given to :func:`install` (``deferred`` imports this module through ``kernels``, so this
# module cannot import it).
_run_pending: Callable[[FlushCause], object] = _no_pending_graph


def _settle() -> None:
    """Run the pending DeferAndFuse graph, whose random ops draw from the state as it is now."""
    _run_pending(FlushCause.RNG_STATE)


def _mix(seed: int, offset: int) -> int:
    """A 64-bit engine seed from a (seed, offset) pair: splitmix64's finaliser, so nearby pairs seed unrelated
    streams."""
    z = (seed + (offset + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _is_tpu(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "tpu"
    if isinstance(device, str):  # read without torch.device: :data:`default` is built before "tpu" parses
        return device.partition(":")[0] == "tpu"
    return False


default = DeviceGenerator()  # ``torch.tpu.default_generators[0]``


def install(run_pending: Callable[[FlushCause], object]) -> None:
    """Make ``torch.Generator`` the emulation-aware subclass (once, at device registration), and seed the device
    generator as the CPU's was: a ``torch.manual_seed`` before activation applies to the device too, as one before
    CUDA's lazy initialisation does. ``run_pending(cause)`` is DeferAndFuse's flush, which every read, seed or
    restore of a device generator's state calls first."""
    global _run_pending
    _run_pending = run_pending
    default.manual_seed(torch.initial_seed())
    Generator.__doc__ = _CGenerator.__doc__
    torch.Generator = Generator
