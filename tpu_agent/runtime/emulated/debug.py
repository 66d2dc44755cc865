"""Debug Eager checks (DEFER_NEVER_AND_LAUNCH_BLOCKING, or ``TORCH_TPU_ENABLE_DEBUG_CHECKS=1``).

Each op has already run to completion (launch blocking); these checks then catch what a TPU would otherwise
report far from its cause: an op that *introduces* NaN or Inf (inputs finite, output not) is named together
with the user's source line. Ops that pass non-finite values through (a masked fill with ``-inf``, a softmax
over an already-NaN row) are not blamed.
"""

from __future__ import annotations

from typing import Any

import torch

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import ops


class TpuDebugCheckError(RuntimeError):
    """Raised by Debug Eager when an op's output fails a check."""


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _has_nonfinite_scalar(args: Any) -> bool:
    for a in args:
        if isinstance(a, float) and (a != a or a in (float("inf"), float("-inf"))):
            return True
    return False


def check(func: Any, cargs: list, ckwargs: dict, out: Any) -> None:
    """Raise :class:`TpuDebugCheckError` if ``func`` turned finite inputs into NaN/Inf outputs."""
    if func in ops.DEBUG_SKIP_FINITE_CHECK:
        return
    outputs = [t for t in _tensors(out) if (t.is_floating_point() or t.is_complex()) and t.layout is torch.strided]
    if not outputs:
        return
    bad = [t for t in outputs if t.numel() and not bool(torch.isfinite(t).all())]
    if not bad:
        return
    inputs = _tensors(cargs) + _tensors(list(ckwargs.values()))
    if any(
        (t.is_floating_point() or t.is_complex()) and t.numel() and not bool(torch.isfinite(t).all()) for t in inputs
    ):
        return
    if _has_nonfinite_scalar(cargs) or _has_nonfinite_scalar(ckwargs.values()):
        return
    kind = "NaN" if any(bool(torch.isnan(t).any()) for t in bad) else "Inf"
    site = events.user_call_site(2)
    where = f" at {site.file}:{site.line} (in {site.function})" if site else ""
    raise TpuDebugCheckError(
        f"TorchTPU debug check failed: op {func} produced {kind} from finite inputs{where}. "
        "Debug Eager (TORCH_TPU_LAUNCH_BLOCKING=1) stops at the first op that creates non-finite values."
    )
