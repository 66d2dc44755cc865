"""The ``torch.tpu`` module of TorchTPU 0.2.0 (reference §1.3-§1.5), backed by the emulated device.

It is a :class:`types.ModuleType` subclass so that ``eager_mode`` and ``allow_excess_precision`` can be module
properties, as in TorchTPU. Rules reproduced on purpose:

* the legacy CUDA-style calls (``is_available``, ``device_count``, ``set_device``...) are *internal*: called
  from user code they raise TorchTPU's RuntimeError, or warn once with ``TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1``;
  torch and torch_tpu (and this emulation) may call them;
* experimental APIs warn once with the ``<TorchTpu/ApiStage/ExperimentalApi/>`` prefix;
* one device per process: ``set_device`` only accepts the bound index.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

import torch

from tpu_agent.runtime.emulated import backends_tpu, compile_cache, generator, memory, modes, state, streams
from tpu_agent.runtime.emulated.flush_cause import FlushCause
from tpu_agent.runtime.emulated.state import (
    EagerMode,
    Precision,
    check_device_index,
    index_of,
)
from tpu_agent.runtime.emulated.streams import TpuEvent, TpuStream, synchronize_device

F = TypeVar("F", bound=Callable[..., Any])
_ALLOWED_CALLER_PREFIXES = ("torch", "torch_tpu", "tpu_agent")
_warned: set[str] = set()

AMP_SUPPORTED_DTYPES = [
    torch.bfloat16,
    torch.bool,
    torch.complex128,
    torch.complex64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.int8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.uint8,
]


def _caller_is_framework(depth: int) -> bool:
    name = sys._getframe(depth).f_globals.get("__name__", "")
    return name.split(".", 1)[0] in _ALLOWED_CALLER_PREFIXES


def internal(prefer: str) -> Callable[[F], F]:
    """Mark a legacy device API internal to TorchTPU (reference §1.4): user callers get an error or a warning."""

    def decorate(fn: F) -> F:
        name = fn.__name__

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not _caller_is_framework(2) and not torch.compiler.is_compiling():
                if os.environ.get("TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS") != "1":
                    raise RuntimeError(
                        f"{name} is internal to TorchTPU and can only be called by the PyTorch framework "
                        f"(torch and torch_tpu). Use {prefer} instead."
                    )
                if name not in _warned:
                    _warned.add(name)
                    warnings.warn(
                        f"<TorchTpu/ApiStage/InternalApi/> torch.tpu.{name} is internal to TorchTPU; use {prefer} instead.",
                        UserWarning,
                        stacklevel=2,
                    )
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def experimental(fn: F) -> F:
    """Warn once per API, as TorchTPU does for every experimental ``torch.tpu`` member."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if name not in _warned and not _caller_is_framework(2):
            _warned.add(name)
            warnings.warn(
                f"<TorchTpu/ApiStage/ExperimentalApi/> torch.tpu.{name} is experimental and may change without notice.",
                UserWarning,
                stacklevel=2,
            )
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _device_generator(device: Any = None) -> torch.Generator:
    """The device's default generator. Seeding, reading or restoring it runs the pending DeferAndFuse graph first
    (see :mod:`generator`): TorchTPU's docs use ``torch.tpu.manual_seed_all`` as a flush.

    ``device`` may name any chip of the host: torch code written for processes that see every device asks for
    other chips' states (``fork_rng``'s default device list; DTensor's random ops on rank ``r`` use device
    ``r % device_count()``). The process's one generator, its own chip's, answers for them."""
    if device is not None:
        index = index_of(device)
        if not 0 <= index < state.host_devices:
            raise ValueError(
                f"TPU device index {index} is not on this host, which has {state.host_devices} TPU devices "
                f"(0 to {state.host_devices - 1})"
            )
    return generator.default


class TpuDeviceProperties(NamedTuple):
    """``torch.tpu.get_device_properties()``: HBM per device; TorchTPU has no FLOP/s field."""

    name: str
    total_memory: int
    multi_processor_count: int = 1


class TpuModule(modes.ExecutionSettings):
    """``torch.tpu`` for the emulated device."""

    EagerMode = EagerMode
    Precision = Precision
    Stream = TpuStream
    Event = TpuEvent
    TpuStream = TpuStream
    TpuEvent = TpuEvent

    # --- properties (module attributes in TorchTPU; eager_mode and enable_cpu_fallback come from the base) ---
    # one setting under both names: torch.backends.tpu's property is this one
    allow_excess_precision = backends_tpu.BackendsTpu.allow_excess_precision

    # --- internal legacy device API (reference §1.4) ---
    @staticmethod
    @internal("torch.accelerator.is_available")
    def is_available() -> bool:
        return True

    @staticmethod
    @internal("torch.accelerator.device_count")
    def device_count() -> int:
        return state.visible_devices

    @staticmethod
    @internal("torch.accelerator.current_device_index")
    def current_device() -> int:
        return 0

    @staticmethod
    @internal("torch.accelerator.set_device_index")
    def set_device(device: Any) -> None:
        check_device_index(index_of(device))

    @staticmethod
    @internal("torch.accelerator.synchronize")
    def synchronize(device: Any = None) -> None:
        synchronize_device(FlushCause.SYNCHRONIZE)

    @staticmethod
    @internal("torch.accelerator.current_stream")
    def current_stream(device: Any = None) -> streams.TpuStream:
        return TpuStream(device)

    @staticmethod
    @internal("torch.accelerator.set_stream")
    def set_stream(stream: Any) -> None:
        return None

    @staticmethod
    @internal("torch.accelerator.random.initial_seed")
    def initial_seed() -> int:
        return _device_generator().initial_seed()

    @staticmethod
    @internal("torch.accelerator.random.get_rng_state")
    def get_rng_state(device: Any = "tpu") -> torch.Tensor:
        return _device_generator(device).get_state()

    class device:  # noqa: N801 - TorchTPU's name
        """``torch.tpu.device(i)``: internal; negative or None indices are a no-op."""

        @internal("torch.accelerator.device_index")
        def __init__(self, device: Any) -> None:
            self.index = index_of(device) if device is not None else -1

        def __enter__(self) -> None:
            if self.index >= 0:
                check_device_index(self.index)

        def __exit__(self, *exc: Any) -> None:
            return None

    # --- experimental public API ---
    @staticmethod
    @experimental
    def default_stream(device: Any = None) -> streams.TpuStream:
        return TpuStream(device, stream_id=0)

    @staticmethod
    @experimental
    @contextlib.contextmanager
    def stream(stream: Any) -> Iterator[None]:
        yield

    class device_of:  # noqa: N801
        """No-op unless ``obj`` is on a tpu; the process has one device, so always a no-op."""

        def __init__(self, obj: Any) -> None:
            self.obj = obj

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: Any) -> None:
            return None

    @staticmethod
    @experimental
    def get_device_name(device: Any = None) -> str:
        index_of(device)
        assert state.chip is not None
        return state.chip.device_name

    @staticmethod
    @experimental
    def get_device_properties(device: Any = None) -> TpuDeviceProperties:
        index_of(device)
        assert state.chip is not None
        return TpuDeviceProperties(name=state.chip.device_name, total_memory=state.chip.hbm_bytes_per_device)

    @staticmethod
    @experimental
    def is_initialized() -> bool:
        return True

    # --- the device's random-number generator (generator.default; the CPU's is torch's own) ---
    @staticmethod
    @experimental
    def manual_seed(seed: int) -> None:
        _device_generator().manual_seed(int(seed))

    @staticmethod
    @experimental
    def manual_seed_all(seed: int) -> None:
        """Seed every device of the process (it has one); ``torch.manual_seed`` and ``torch.seed`` call this."""
        _device_generator().manual_seed(int(seed))

    @staticmethod
    @experimental
    def seed() -> None:
        _device_generator().seed()

    @staticmethod
    @experimental
    def seed_all() -> None:
        _device_generator().seed()

    @staticmethod
    @experimental
    def set_rng_state(new_state: torch.Tensor, device: Any = "tpu") -> None:
        _device_generator(device).set_state(new_state)

    @staticmethod
    @experimental
    def get_rng_state_all() -> list[torch.Tensor]:
        return [_device_generator().get_state()]

    @staticmethod
    @experimental
    def set_rng_state_all(new_states: Any) -> None:
        """One state per device of the process, as ``get_rng_state_all`` gives them (one device per process)."""
        states = list(new_states)
        if len(states) != 1:
            raise ValueError(
                f"torch.tpu.set_rng_state_all: got {len(states)} states, but this process has one TPU device; "
                "pass the list torch.tpu.get_rng_state_all() returned"
            )
        _device_generator().set_state(states[0])

    @property
    def default_generators(self) -> tuple[torch.Generator, ...]:
        return (generator.default,)

    @staticmethod
    @experimental
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return list(AMP_SUPPORTED_DTYPES)

    @staticmethod
    @experimental
    def set_eager_mode(mode: state.EagerMode) -> contextlib.AbstractContextManager[None]:
        return modes.set_eager_mode(mode)

    @staticmethod
    @experimental
    def precision(mode: state.Precision) -> contextlib.AbstractContextManager[None]:
        return modes.precision(mode)

    @staticmethod
    def topology_aware_mesh(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            "<TorchTpu/ApiStage/DeprecatedApi/> torch.tpu.topology_aware_mesh is deprecated; use torch.tpu.distributed.topology_aware_mesh.",
            UserWarning,
            stacklevel=2,
        )
        # Not emulated: the mesh layout depends on a physical slice's ICI coordinates, which one emulated chip lacks.
        raise NotImplementedError("topology_aware_mesh needs a physical TPU slice; the emulated device has one chip")

    # --- private helpers torch and the docs use ---
    # Read by torch.utils.checkpoint: a device module that is not initialised has no RNG state worth saving, and
    # checkpointed dropout would then draw other numbers when it recomputes the forward.
    _initialized = True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def _lazy_init() -> None:
        return None

    @staticmethod
    def _get_compute_capability() -> str:
        return ""

    @staticmethod
    def _is_triton_capable() -> bool:
        return False

    @staticmethod
    def _is_gpu() -> bool:
        return False

    @staticmethod
    def _get_multi_processor_count() -> int:
        return 1

    @staticmethod
    def _is_autocast_enabled() -> bool:
        return torch.is_autocast_enabled("tpu")

    @staticmethod
    def _get_autocast_dtype() -> torch.dtype:
        return torch.get_autocast_dtype("tpu")

    @staticmethod
    def _set_autocast_enabled(enabled: bool) -> None:
        torch.set_autocast_enabled("tpu", enabled)

    @staticmethod
    def _set_autocast_dtype(dtype: torch.dtype) -> None:
        if dtype not in AMP_SUPPORTED_DTYPES:
            raise ValueError(f"dtype {dtype} is not supported by TPU autocast; supported: {AMP_SUPPORTED_DTYPES}")
        torch.set_autocast_dtype("tpu", dtype)

    @staticmethod
    def _hbm_usage_summary() -> str:
        executables = compile_cache.executables()
        return (
            f"CompilationCache HBM usage: 0B for {executables} executables. Live tensors: {memory.allocated_bytes()}B."
        )

    @staticmethod
    def _get_cache_stats() -> compile_cache.CacheStats:
        return compile_cache.stats()

    @staticmethod
    def _get_cache_requests() -> int:
        return compile_cache.requests

    @staticmethod
    def _get_cache_hits() -> int:
        return compile_cache.hits

    @staticmethod
    def _get_cache_misses() -> int:
        return compile_cache.requests - compile_cache.hits

    @staticmethod
    def _clear_cache() -> None:
        """Forget every executable: the XLA executables too, when this run compiles with XLA, so the next request
        of each compiles again (as TorchTPU's clear does, e.g. after changing compiler options)."""
        compile_cache.clear()
        xla_cache = sys.modules.get("tpu_agent.runtime.xla.cache")
        if xla_cache is not None:
            xla_cache.executables.clear()


def build_module() -> TpuModule:
    """A fresh ``torch.tpu`` module object (registered by :func:`device.register`)."""
    module = TpuModule("torch.tpu", "TorchTPU API on the tpu-agent emulated device")
    return module
