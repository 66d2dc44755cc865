"""Registering the emulated ``tpu`` device with PyTorch (once per process).

PrivateUse1 is renamed to ``tpu`` through torch's Python-backend recipe, so ``torch.device("tpu")``,
``torch.accelerator.*``, ``Tensor.tpu()``/``.is_tpu`` and ``Module.tpu()`` work as with TorchTPU. Factory
functions (``torch.empty/zeros/arange(..., device="tpu")``) reach the PrivateUse1 kernels registered here;
every op on an existing tpu tensor reaches :class:`tensor.TpuTensor`'s dispatcher.

The generic ``torch.accelerator`` helpers whose C++ side needs a real device allocator or stream
(``synchronize``, ``memory_stats``...) are routed to the emulation, and ``torch.set_float32_matmul_precision``
is remapped as TorchTPU does (reference §6.2).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import (
    autograd_queue,
    backends_tpu,
    compile_cache,
    deferred,
    device_guard,
    dispatch,
    fsdp1_offload,
    generator,
    host_memory,
    memory,
    modes,
    placement,
    shape_cache,
    state,
    storage,
    streams,
    tensor,
    tpu_module,
    unsupported,
)
from tpu_agent.runtime.emulated.flush_cause import FlushCause

aten = torch.ops.aten
_libraries: list[torch.library.Library] = []  # keep registrations alive for the process

# Factory overloads whose composite kernels create an empty tensor and resize it in an ``out=`` call; a wrapper
# tensor cannot be resized, so these build the CPU result first and wrap it.
RESIZING_FACTORIES = (
    "arange",
    "arange.start",
    "arange.start_step",
    "range",
    "range.step",
    "eye",
    "eye.m",
    "tril_indices",
    "triu_indices",
    "linspace",
    "logspace",
)


def refuse_foreign_backend() -> None:
    """TpuAgentError if PrivateUse1 already belongs to another backend (real torch_tpu, or any other)."""
    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        raise TpuAgentError(
            code="privateuse1-taken",
            message=f"cannot emulate the tpu device: PyTorch's PrivateUse1 backend is already registered as {name!r}",
            hint="run without the other backend (e.g. set TORCH_DEVICE_BACKEND_AUTOLOAD=0 or use --backend torch_tpu "
            "on a TPU host); only one PrivateUse1 backend can exist per process",
            exit_code=ExitCode.REFUSED,
        )


_warned_indices: set[int] = set()


def _placed(device: torch.device | None) -> None:
    """Every tensor the device allocates passes here. One placed on ``tpu:N`` (N > 0) lands on the process's one
    device, with a warning once per index: TorchTPU binds each process to one device that every rank calls
    ``tpu:0``, and rank-indexed device strings written for CUDA (``f"{device_type}:{local_rank}"``) are the usual
    cause, so the emulation keeps running but says so instead of hiding what a TPU host may refuse."""
    if device is None or not device.index or device.index in _warned_indices:
        return
    _warned_indices.add(device.index)
    events.warn_at_user_line(
        f"a tensor was placed on {device}, but TorchTPU binds each process to one device, tpu:0 on every rank; "
        "the emulation put it there. Use torch.device('tpu') (tpu-agent migrate rewrites rank-indexed devices, "
        "rule TPU107)"
    )


def _factory(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        _placed(kwargs.get("device"))
        kwargs["device"] = placement.DATA_DEVICE
        made = op(*args, **kwargs)
        if made.is_meta and (home := placement.data_device_for(made.numel(), made.dtype)).type == "cpu":
            made = op(*args, **{**kwargs, "device": home})
        return tensor.wrap(made)

    return kernel


def _empty_memory_format(
    size: Any,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> Any:
    _placed(device)
    memory_format = memory_format or torch.contiguous_format
    device = placement.data_device_for(math.prod(size), dtype)
    return tensor.wrap(torch.empty(size, dtype=dtype, memory_format=memory_format, device=device))


def _empty_strided(
    size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> Any:
    _placed(device)
    device = placement.data_device_for(math.prod(size), dtype)
    return tensor.wrap(torch.empty_strided(size, stride, dtype=dtype, device=device))


def _zeros(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> Any:
    """``_efficientzerotensor`` (autograd's zero gradients): real zeros, since the emulator's CPU kernels run with
    the ZeroTensor dispatch key off and would read a storage-less tensor."""
    return tensor.wrap(torch.zeros(size, dtype=dtype, device=placement.DATA_DEVICE))


def _copy_from(src: Any, dst: Any, non_blocking: bool = False) -> Any:
    tensor.unwrap(dst).copy_(tensor.unwrap(src))
    return dst


def _register_kernels() -> None:
    lib = torch.library.Library("aten", "IMPL")
    _libraries.append(lib)
    lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    lib.impl("_efficientzerotensor", _zeros, "PrivateUse1")
    fallbacks = torch.library.Library("_", "IMPL")
    _libraries.append(fallbacks)
    fallbacks.fallback(unsupported.refuse_quantized, "QuantizedPrivateUse1")
    for name in RESIZING_FACTORIES:
        base, _, overload = name.partition(".")
        packet = getattr(aten, base)
        op = getattr(packet, overload or "default")
        lib.impl(name, _factory(op), "PrivateUse1")


def _patch_accelerator() -> None:
    """``torch.accelerator`` helpers whose C++ path needs a real allocator or stream."""
    acc = torch.accelerator

    def synchronize(device: Any = None, /) -> None:
        streams.synchronize_device(FlushCause.SYNCHRONIZE)

    def set_device_index(device: Any, /) -> None:
        state.check_device_index(state.index_of(device))

    def memory_stats(device_index: Any = None, /) -> Any:
        return memory.stats()

    def reset_peak_memory_stats(device_index: Any = None, /) -> None:
        memory.reset_peak()

    def reset_accumulated_memory_stats(device_index: Any = None, /) -> None:
        raise RuntimeError("torch.accelerator.memory.reset_accumulated_memory_stats is not implemented for TPU.")

    def empty_cache() -> None:
        return None

    def get_memory_info(device_index: Any = None, /) -> tuple[int, int]:
        assert state.chip is not None
        total = state.chip.hbm_bytes_per_device
        return (total - memory.allocated_bytes(), total)

    replacements = {
        "synchronize": synchronize,
        "set_device_index": set_device_index,
        "set_device_idx": set_device_index,
        "memory_stats": memory_stats,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
        "empty_cache": empty_cache,
        "get_memory_info": get_memory_info,
    }
    for name, fn in replacements.items():
        for owner in (acc, acc.memory):
            original = getattr(owner, name, None)
            if original is not None:
                fn.__doc__ = original.__doc__
                setattr(owner, name, fn)


def _targets_tpu(map_location: Any) -> bool:
    if isinstance(map_location, (str, torch.device)):
        try:
            return torch.device(map_location).type == "tpu"
        except RuntimeError:
            return False
    if isinstance(map_location, dict):
        return any(_targets_tpu(v) for v in map_location.values())
    return False


def _to_tpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        moved = obj.to("tpu")
        moved.requires_grad_(obj.requires_grad)
        return moved
    if isinstance(obj, dict):
        moved = type(obj)((k, _to_tpu(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # state_dict versions, read by load_state_dict
            setattr(moved, "_metadata", obj._metadata)  # noqa: B010 - an attribute torch's state_dict adds
        return moved
    if isinstance(obj, list):
        return [_to_tpu(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_to_tpu(v) for v in obj)
    return obj


def _patch_serialization() -> None:
    """``torch.load(..., map_location="tpu")``: storages cannot live on the emulated device, so load to the
    host and move the tensors (the same result a device-aware restore gives)."""
    original = torch.load

    @functools.wraps(original)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if _targets_tpu(map_location):
            return _to_tpu(original(f, "cpu", *args, **kwargs))
        return original(f, map_location, *args, **kwargs)

    torch.load = load
    torch.serialization.load = load


def _patch_precision() -> None:
    torch.set_float32_matmul_precision = modes.set_float32_matmul_precision
    torch.get_float32_matmul_precision = modes.get_float32_matmul_precision


def _foreach_kernels_for_tpu_tensors() -> None:
    """Let optimizers and ``clip_grad_norm_`` take their ``foreach`` path on tpu tensors, as on TorchTPU.

    torch picks the multi-tensor (``_foreach_*``) path by default for parameters on a PrivateUse1 device whose
    type is a plain tensor; TorchTPU's parameters are, the emulation's are :class:`tensor.TpuTensor`, which torch's
    type allow-lists do not name, so AdamW would fall back to one op per parameter per update term (about a
    third of a small model's training-step ops). Naming the type there is what ``torch.distributed.tensor``
    does for DTensor; the foreach ops then reach the dispatcher once per tensor list."""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    for allowed in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if tensor.TpuTensor not in allowed:
            allowed.append(tensor.TpuTensor)


def register() -> None:
    """Rename PrivateUse1 to ``tpu`` and install the device pieces (call once, from :func:`activate`)."""
    refuse_foreign_backend()
    module = tpu_module.build_module()
    _setup_privateuseone_for_python_backend("tpu", backend_module=module, device_guard=device_guard.DeviceGuard())
    tensor.set_device(torch.device("tpu", 0))
    tensor.set_dispatcher(dispatch.strict_dispatch)  # until the eager mode is applied (modes.apply_mode)
    _register_kernels()
    _patch_accelerator()
    streams.install()
    _patch_serialization()
    _patch_precision()
    _foreach_kernels_for_tpu_tensors()
    generator.install(run_pending=deferred.flush)
    storage.install()
    fsdp1_offload.install()
    unsupported.install_data_parallel()
    unsupported.install_ddp()
    host_memory.install()
    autograd_queue.install()
    backends_tpu.install()
    compile_cache.set_op_key(shape_cache.key_of)
