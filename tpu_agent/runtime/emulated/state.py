"""Process-wide settings of the emulated device, in one place so every module reads the same values.

The emulated ``tpu`` device is a process singleton, like TorchTPU's: one chip, one eager mode (a global, as in
TorchTPU's C++ atomic), one matmul precision. The hot dispatch path reads these module attributes directly,
so they are plain globals rather than properties.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from typing import Any

import torch

from tpu_agent.chips import Chip
from tpu_agent.runtime.envvars import EAGER_MODES, debug_checks_from_env


class EagerMode(enum.Enum):
    """TorchTPU's eager modes (``torch.tpu.EagerMode``); the values are the enum names TorchTPU logs.

    Which one a process starts in is read from the environment by
    :func:`tpu_agent.runtime.envvars.eager_mode_from_env`, the one reader of TorchTPU's eager-mode variables."""

    DEFER_NEVER = "DEFER_NEVER"  # Strict Eager: each op runs at once
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "DEFER_NEVER_AND_LAUNCH_BLOCKING"  # Debug Eager: each op runs and is checked
    DEFER_AND_FUSE = "DEFER_AND_FUSE"  # Fused Eager: ops are recorded and run at a flush
    # TorchTPU's internal mode for tracing compiled graphs: every op is recorded, as in Fused Eager
    INTERNAL_DEFER_ALL = "INTERNAL_DEFER_ALL"


DEFERRING_MODES = frozenset({EagerMode.DEFER_AND_FUSE, EagerMode.INTERNAL_DEFER_ALL})


class Precision(enum.Enum):
    """``torch.tpu.Precision``: passes of the bf16 MXU used for an f32 matmul."""

    DEFAULT = 0  # 1 pass: inputs rounded to bf16 (8-bit significand)
    HIGH = 1  # 3 passes: about 16 significand bits
    HIGHEST = 2  # 6 passes: the full f32 significand


# torch.set_float32_matmul_precision spellings, remapped as TorchTPU does (reference §6.2).
PRECISION_BY_TORCH_NAME = {"medium": Precision.DEFAULT, "high": Precision.HIGH, "highest": Precision.HIGHEST}
TORCH_NAME_BY_PRECISION = {v: k for k, v in PRECISION_BY_TORCH_NAME.items()}

# The doc names parse_eager_mode accepts: the runtime's --eager-mode spellings (underscored), and "fused".
EAGER_MODE_ALIASES = {
    **{option.cli_name.replace("-", "_"): EagerMode[option.enum_name] for option in EAGER_MODES.values()},
    "fused": EagerMode.DEFER_AND_FUSE,
}

chip: Chip | None = None
host_devices: int = 1  # devices of the emulated host; this process binds one of them
visible_devices: int = 1  # devices this process sees: torch.accelerator.device_count() (see visible_device_count)
eager_mode: EagerMode = EagerMode.DEFER_NEVER
precision: Precision = Precision.DEFAULT
precision_stack: list[Precision] = []
allow_excess_precision: bool = False
cpu_fallback: bool = False  # TorchTPU's execution_mode.enable_cpu_fallback (off by default)
debug_checks: bool = False  # NaN/Inf and operand checks after each op (Debug Eager, or TORCH_TPU_ENABLE_DEBUG_CHECKS=1)
log_enabled: bool = False  # mirrors events.get_log().enabled, read per op

# The settings above change only through the functions below (tests/test_architecture.py): each names who sets what.


def bind_host(host: int, env: Mapping[str, str]) -> None:
    """Activation: the emulated host has ``host`` devices, of which this process sees :func:`visible_device_count`."""
    global host_devices, visible_devices
    host_devices = host
    visible_devices = visible_device_count(host, env)


def bind_chip(value: Chip) -> None:
    """Activation: the chip ``torch.tpu.get_device_name`` and the device properties report."""
    global chip
    chip = value


def use_eager_mode(mode: EagerMode) -> None:
    """The mode switch (:func:`modes.apply_mode`): the mode, and the debug checks that follow from it."""
    global eager_mode, debug_checks
    eager_mode = mode
    debug_checks = debug_checks_from_env(os.environ, mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING)


def set_precision(value: Precision) -> None:
    """``torch.set_float32_matmul_precision`` as TorchTPU remaps it (:func:`modes.set_float32_matmul_precision`)."""
    global precision
    precision = value


def set_allow_excess_precision(value: bool) -> None:
    """``torch.backends.tpu.allow_excess_precision`` (or its ``XLA_FLAGS`` spelling)."""
    global allow_excess_precision
    allow_excess_precision = value


def set_cpu_fallback(value: bool) -> None:
    """``torch.tpu.enable_cpu_fallback`` / ``execution_mode.enable_cpu_fallback``."""
    global cpu_fallback
    cpu_fallback = value


def set_log_enabled(value: bool) -> None:
    """The event log's state, when telemetry opens it."""
    global log_enabled
    log_enabled = value


def visible_device_count(host: int, env: Mapping[str, str]) -> int:
    """The devices a process sees, as TorchTPU binds them: each process of a multi-process run sees its one chip.

    ``TPU_VISIBLE_DEVICES`` is TorchTPU's source of truth (``tpu-agent run --nproc N`` sets it to each rank's
    local rank, as TorchTPU's launch environment does); a process that is one of several on its host
    (``LOCAL_WORLD_SIZE`` > 1, e.g. a ``torch.distributed.run`` worker the script started) sees one device; a lone
    process sees the host's ``host`` devices, as a single TorchTPU process counts the host's chips.
    """
    listed = [name for name in env.get("TPU_VISIBLE_DEVICES", "").split(",") if name.strip()]
    if listed:
        return min(len(listed), host)
    return 1 if int(env.get("LOCAL_WORLD_SIZE", "1") or "1") > 1 else host


def effective_precision() -> Precision:
    """The scoped ``torch.tpu.precision`` if one is active, else the global setting."""
    return precision_stack[-1] if precision_stack else precision


def parse_eager_mode(value: str | EagerMode) -> EagerMode:
    """Accept the enum, its name (any case) or the doc names strict/debug/defer_and_fuse."""
    if isinstance(value, EagerMode):
        return value
    key = str(value).strip()
    if key.upper() in EagerMode.__members__:
        return EagerMode[key.upper()]
    if key.lower() in EAGER_MODE_ALIASES:
        return EAGER_MODE_ALIASES[key.lower()]
    from tpu_agent.errors import TpuAgentError

    raise TpuAgentError(
        code="unknown-eager-mode",
        message=f"unknown eager mode {value!r}",
        hint="use one of: strict, debug, defer_and_fuse (or DEFER_NEVER, DEFER_NEVER_AND_LAUNCH_BLOCKING, DEFER_AND_FUSE)",
    )


def index_of(device: Any) -> int:
    """The device index a ``torch.tpu``/``torch.accelerator`` argument names (None, int, "tpu:N" or a device)."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        return 0 if device.index is None else device.index
    raise TypeError(f"Invalid device type {type(device).__name__}; expected int, str or torch.device")


def check_device_index(index: int) -> None:
    """One device per process: any index other than the bound one is refused (reference §1.2)."""
    if index != 0:
        raise ValueError(
            f"Cannot set TPU device to index {index}, current process is bound to device index 0. "
            "Changing the active TPU device within a process is not supported."
        )
