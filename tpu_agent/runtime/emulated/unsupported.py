"""TorchTPU's refusals for ops and dtypes it does not implement (rules in :data:`ops.UNSUPPORTED_RULES`).

With the CPU fallback off (TorchTPU's default) the op raises TorchTPU's error text; with it on
(``torch.tpu.enable_cpu_fallback = True``) it warns ``... Falling back to CPU``, runs, and the event log
records a FallbackOp, the performance cliff the profiler reports.

``torch.nn.DataParallel`` (one process driving several devices) is refused the same way when it would span
more than one tpu device (:func:`install_data_parallel`), and ``DistributedDataParallel`` with
``find_unused_parameters=True`` or ``static_graph=True`` on tpu parameters at construction (:func:`install_ddp`):
torch's C++ reducer then copies its map of used parameters to the device through pinned host memory, which it asks
the device's C++ hooks for, and a Python device has none, so the first backward would fail deep in autograd with
``getPinnedMemoryAllocator``.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

import torch
from torch.utils import _pytree

from tpu_agent.runtime.emulated import ops, state, telemetry

aten = torch.ops.aten

SPARSE_OPS = frozenset(
    {
        aten._to_sparse.default,
        aten._to_sparse.sparse_dim,
        aten._to_sparse_csr.default,
        aten._to_sparse_csc.default,
        aten._to_sparse_bsr.default,
        aten._to_sparse_bsc.default,
        aten.to_sparse.default,
        aten.to_sparse.sparse_dim,
    }
)
QUANTIZE_OPS = frozenset(
    {aten.quantize_per_tensor.default, aten.quantize_per_channel.default, aten.quantize_per_tensor_dynamic.default}
)
DTYPE_OPS = frozenset({aten._to_copy.default})
SCALED_MM_OPS = frozenset({aten._scaled_mm.default})
CHECKED_OPS = SPARSE_OPS | QUANTIZE_OPS | DTYPE_OPS | SCALED_MM_OPS | ops.NO_TPU_KERNEL


def _op_name(func: Any) -> str:
    return func._schema.name  # e.g. "aten::linalg_eig"


def check(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise (or warn and record a fallback) when ``func`` is something TorchTPU cannot run."""
    if func in SPARSE_OPS:
        raise RuntimeError(f"{_op_name(func)}: sparse operators are not supported on TPU yet")
    if func in QUANTIZE_OPS:
        dtype = kwargs.get("dtype", args[-1] if args else None)
        raise NotImplementedError(f"TorchTPU does not yet support dtype {str(dtype).removeprefix('torch.')}")
    if func in DTYPE_OPS:
        dtype = kwargs.get("dtype")
        if dtype is torch.complex32:
            raise NotImplementedError("TorchTPU does not yet support dtype complex32")
        if dtype in ops.QUANTIZED_DTYPES:
            raise NotImplementedError(f"TorchTPU does not yet support dtype {str(dtype).removeprefix('torch.')}")
        return
    if func in SCALED_MM_OPS:
        if kwargs.get("use_fast_accum") or (len(args) > 7 and args[7]):
            raise RuntimeError("use_fast_accum=true is not supported yet on TPU")
        return
    if func in ops.NO_TPU_KERNEL:
        name = _op_name(func)
        if not state.cpu_fallback:
            raise NotImplementedError(ops.not_implemented_message(name))
        warnings.warn(ops.fallback_message(name), stacklevel=4)
        telemetry.emit_fallback(name)


def check_layout(t: torch.Tensor) -> None:
    """Refuse data the ``tpu`` device cannot hold: sparse layouts and quantized tensors (never kept silently)."""
    if t.layout is not torch.strided:
        raise RuntimeError(
            f"sparse tensors ({t.layout}) are not supported on TPU yet; keep sparse data on the CPU, or call "
            ".to_dense() before moving it to the tpu device"
        )
    if t.is_quantized:
        raise NotImplementedError(f"TorchTPU does not yet support dtype {str(t.dtype).removeprefix('torch.')}")


def refuse_quantized(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Boxed fallback for the quantized ``tpu`` dispatch key: every op on quantized tpu data is refused."""
    raise NotImplementedError(
        f"{op._schema.name}: quantized tensors are not supported on TPU; dequantize on the CPU (x.dequantize()) first"
    )


def _data_parallel_scatter(self: Any, inputs: Any, kwargs: Any, device_ids: Any) -> Any:
    """``DataParallel.scatter`` on tpu. Torch scatters with ``torch._C._scatter``, a CUDA communication op; with
    one device that only copies the inputs to it, which is all a TorchTPU process can hold (one chip per process),
    so one device runs as torch runs one GPU. More than one is refused with the fix, rule TPU406's."""
    if self.src_device_obj.type != "tpu":
        return _torch_scatter(self, inputs, kwargs, device_ids)
    if len(device_ids) > 1:
        raise RuntimeError(
            f"torch.nn.DataParallel over tpu devices {list(device_ids)}: TorchTPU runs one device per process and "
            "does not support DataParallel (single process, several devices). Use DistributedDataParallel (or FSDP) "
            "with one process per chip: dist.init_process_group('tpu_dist'), model = DDP(model), launched with "
            "`tpu-agent run --nproc N` (migrate rule TPU406: `tpu-agent rules TPU406`)."
        )
    device = self.src_device_obj

    def move(x: Any) -> Any:
        return x.to(device) if isinstance(x, torch.Tensor) else x

    return (_pytree.tree_map(move, tuple(inputs)),), (_pytree.tree_map(move, dict(kwargs or {})),)


_torch_scatter = torch.nn.DataParallel.scatter


def install_data_parallel() -> None:
    """Route ``torch.nn.DataParallel``'s scatter through :func:`_data_parallel_scatter` (once, at registration)."""
    torch.nn.DataParallel.scatter = _data_parallel_scatter


_UNUSED_PARAMETERS_MESSAGE = (
    "DistributedDataParallel({argument}=True) over tpu parameters is not emulated: torch's C++ reducer copies its map "
    "of used parameters to the device through pinned host memory, which it asks the device's C++ allocator for, "
    "and the emulated device (a Python backend) has none; TorchTPU itself runs it. Here, drop {argument} when "
    "every parameter gets a gradient in every step; for parameters a step leaves unused, freeze those never trained "
    "(p.requires_grad_(False)) or add 0 * p.sum() for them to the loss so that every step uses them."
)


def _tracks_unused_parameters(module: Any, argument: str) -> None:
    if any(p.device.type == "tpu" for p in module.parameters()):
        raise RuntimeError(_UNUSED_PARAMETERS_MESSAGE.format(argument=argument))


def install_ddp() -> None:
    """Refuse ``DistributedDataParallel`` with unused-parameter tracking on tpu at construction and at
    ``_set_static_graph()``, with the way around it, instead of at the first backward (once, at registration)."""
    ddp = torch.nn.parallel.DistributedDataParallel
    original_init, original_set_static_graph = ddp.__init__, ddp._set_static_graph
    signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs).arguments
        for argument in ("find_unused_parameters", "static_graph"):
            if bound.get(argument):
                _tracks_unused_parameters(bound["module"], argument)
        original_init(self, *args, **kwargs)

    @functools.wraps(original_set_static_graph)
    def set_static_graph(self: Any) -> None:
        _tracks_unused_parameters(self.module, "static_graph")
        original_set_static_graph(self)

    ddp.__init__ = init
    ddp._set_static_graph = set_static_graph
