"""Ops whose CPU kernel refuses inputs that TorchTPU's (XLA's) kernels accept, and how the emulation computes
them instead: one record per gap, as data, so the table can be read, tested and extended.

The emulated device runs every op with the CPU's kernel. Where that kernel lacks a dtype the device has
(transformers' mixture-of-experts path calls ``torch.histc`` on int tensors on every device except cpu/mps),
the op must still work on ``tpu``: the record's ``compute`` gets the CPU arguments and returns the result the
device would, e.g. by upcasting to a dtype the CPU kernel takes and casting the result back (exact for the ops
listed: counts and nearest-neighbour copies of integers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

aten = torch.ops.aten

INTEGER_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


@dataclass(frozen=True)
class CpuGap:
    """A class of inputs the CPU kernel of ``ops`` refuses, and the computation used instead."""

    name: str
    ops: tuple[Any, ...]
    refused_dtypes: frozenset[torch.dtype]
    compute: Callable[[Any, list, dict], Any]
    cpu_error: str  # what the CPU kernel says (never shown to users: the emulation computes instead)
    rationale: str


def _upcast_and_back(via: torch.dtype) -> Callable[[Any, list, dict], Any]:
    """Run ``func`` with its first tensor argument in ``via`` and return the result in the input's dtype."""

    def compute(func: Any, cargs: list, ckwargs: dict) -> Any:
        source = cargs[0]
        out = func(source.to(via), *cargs[1:], **ckwargs)
        return out.to(source.dtype)

    return compute


GAPS: tuple[CpuGap, ...] = (
    CpuGap(
        name="histc-integer",
        ops=(aten.histc.default,),
        refused_dtypes=INTEGER_DTYPES,
        compute=_upcast_and_back(torch.float64),
        cpu_error="\"histogram_cpu\" not implemented for 'Int'",
        rationale="device kernels count integer inputs (transformers' MoE grouped-matmul path relies on it); "
        "float64 holds every int32 exactly and the counts are integers, so the cast back is exact",
    ),
    CpuGap(
        name="upsample-nearest-integer",
        ops=tuple(getattr(getattr(aten, f"upsample_nearest{n}d"), o) for n in (1, 2, 3) for o in ("default", "vec")),
        refused_dtypes=INTEGER_DTYPES - {torch.uint8},
        compute=_upcast_and_back(torch.float64),
        cpu_error="\"upsample_nearest2d_channels_last\" not implemented for 'Int'",
        rationale="nearest-neighbour resizing only copies values, so a float64 round trip is exact for integers",
    ),
)

BY_OP: dict[Any, CpuGap] = {op: gap for gap in GAPS for op in gap.ops}


def compute(gap: CpuGap, func: Any, cargs: list, ckwargs: dict) -> Any:
    """``func`` on CPU arguments: the CPU kernel, or the gap's computation when its input is one the CPU refuses."""
    first = cargs[0] if cargs else None
    if isinstance(first, torch.Tensor) and first.dtype in gap.refused_dtypes:
        return gap.compute(func, cargs, ckwargs)
    return func(*cargs, **ckwargs)
