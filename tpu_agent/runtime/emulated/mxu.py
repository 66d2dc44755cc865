"""The MXU's view of a matmul operand: f32/f16 inputs rounded as TorchTPU's bf16 systolic array rounds them.

TorchTPU rounds f32 operands of matmul-family ops (:data:`ops.MXU_OPERANDS`) to bf16 for one pass at
``Precision.DEFAULT`` and to about 16 significand bits at ``HIGH``; ``HIGHEST`` keeps full f32. The emulation
rounds the CPU operands the same way before the CPU kernel runs (:func:`kernels.run_on_cpu`), in every eager mode.

Rounding a large weight on every use would cost as much as the matmul itself, so rounded copies are cached per
base tensor and version (:func:`round_operand`). The cache is dropped at each optimizer step (the weights
changed: :func:`install` registers that hook) and whenever a caller takes a tensor's data for writing outside
the dispatcher (:func:`clear_cache`). This module knows nothing of the tpu tensor type: a wrapper's CPU data
is its ``_elem`` attribute, which plain tensors lack.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from tpu_agent.runtime.emulated import state

_Tensor = torch.Tensor


def round_mantissa(t: torch.Tensor, bits: int) -> torch.Tensor:
    """An f32 tensor rounded to ``bits`` explicit significand bits (round to nearest even), still f32.

    Integer arithmetic on the bit pattern; for ``bits=7`` it is bit-identical to a bf16 round trip.
    """
    drop = 23 - bits
    i = t.view(torch.int32)
    r = (i >> drop) & 1
    r += (1 << (drop - 1)) - 1
    r += i
    r.bitwise_and_(-(1 << drop))  # not `&=`: __iand__ cannot be functionalised when the XLA path traces it
    return r.view(torch.float32)


def _round_dense(t: torch.Tensor, precision: state.Precision) -> torch.Tensor:
    if precision is state.Precision.DEFAULT:
        return t.to(torch.bfloat16).to(torch.float32)  # vectorised conversions: the cheapest RNE on CPU
    return round_mantissa(t, 16)


# Rounded copies of MXU operands, per base tpu tensor and version: a weight feeds the forward and the
# backward matmul, an activation the forward and the weight-gradient matmul, a gradient two backward matmuls
# (once transposed), so each base is rounded once and every view of it is cut from the rounded copy. The
# wrapper's version counter is shared by all its views, so any in-place write invalidates the entry.
# Parameters are held strongly (they live all run; weakrefs would block ``Module.to``'s tensor swap),
# other bases weakly, so the cache never keeps activations alive. Cleared at every optimizer step.
# keyed by _cache_key (ints hash in C, enums not): (base or a weak reference to it, its version, the rounded copy,
# whether the reference is strong, the views of the rounded copy cut so far by layout)
_rounded: dict[int, tuple[Any, int, torch.Tensor, bool, dict]] = {}
ROUNDED_CACHE_ENTRIES = 1024


def _cache_key(base: Any, precision: state.Precision) -> int:
    return id(base) * 4 + precision.value


def clear_cache() -> None:
    """Forget every rounded copy (their sources may be written behind the version counters' back)."""
    _rounded.clear()


def _evict(key: int) -> Any:
    return lambda _ref: _rounded.pop(key, None)


def round_operand(
    operand: Any, elem: torch.Tensor, precision: state.Precision, version: int | None = None
) -> torch.Tensor:
    """``elem`` (the CPU data of wrapper ``operand``) rounded for the MXU, reusing its base's rounding.

    ``version`` is the base's version counter as of the op (DeferAndFuse's executor runs an op after recording
    has advanced the counters; the recorder keeps the value each MXU operand had); default: the current one."""
    base = operand._base
    base_elem: Any  # the base wrapper's CPU data: a plain tensor, or anything else while Dynamo traces
    if base is None:
        base, base_elem = operand, elem
    else:
        base_elem = getattr(base, "_elem", None)
        if (
            type(base_elem) is not _Tensor
            or type(elem) is not _Tensor  # fake tensors while Dynamo traces: no storage to compare
            or base_elem.untyped_storage().data_ptr() != elem.untyped_storage().data_ptr()
        ):
            return _round_dense(elem, precision)
    if type(base_elem) is not _Tensor or base_elem.storage_offset() != 0 or not base_elem.is_contiguous():
        return _round_dense(elem, precision)
    key = _cache_key(base, precision)
    if version is None:
        version = base._version
    entry = _rounded.get(key)
    if entry is not None and entry[1] == version and (entry[0] if entry[3] else entry[0]()) is base:
        rounded_base, views = entry[2], entry[4]
    else:
        rounded_base, views = _round_dense(base_elem, precision), {}
        if len(_rounded) >= ROUNDED_CACHE_ENTRIES:
            _rounded.clear()
        strong = base.is_leaf and base.requires_grad
        _rounded[key] = (base if strong else weakref.ref(base, _evict(key)), version, rounded_base, strong, views)
    if elem is base_elem:
        return rounded_base
    # the same views of a base recur (a weight's transpose feeds every step's matmuls): cut each once
    layout = (elem.shape, elem.stride(), elem.storage_offset())
    view = views.get(layout)
    if view is None:
        view = views[layout] = rounded_base.as_strided(*layout)
    return view


def mxu_operand(t: Any, precision: state.Precision, operand: Any = None, version: int | None = None) -> Any:
    """An MXU input as TorchTPU sees it: f32/f16 rounded to bf16 (DEFAULT) or ~16 bits (HIGH).
    ``operand`` is the wrapper ``t`` came from, when known (enables the rounding cache; ``version``: see
    :func:`round_operand`)."""
    if not isinstance(t, _Tensor):
        return t
    dtype = t.dtype
    if dtype is torch.float32:
        if operand is not None and getattr(operand, "_elem", None) is t:
            return round_operand(operand, t, precision, version)
        return _round_dense(t, precision)
    if dtype is torch.float16 and precision is state.Precision.DEFAULT:
        return t.to(torch.bfloat16).to(torch.float16)
    return t


def check_operands(spec: tuple[str, int, int], cargs: list) -> None:
    """TorchTPU's own operand checks for the ops in :data:`ops.SAME_DTYPE_OPERANDS` (any eager mode); ``spec`` is
    the op's entry there (its ``OpPlan.same_dtype``)."""
    name, i, j = spec
    a, b = cargs[i], cargs[j]
    if isinstance(a, _Tensor) and isinstance(b, _Tensor) and a.dtype != b.dtype:
        raise RuntimeError(
            f"{name}(): expected the two arguments to have the same dtype, got "
            f"{str(a.dtype).removeprefix('torch.')} vs {str(b.dtype).removeprefix('torch.')}"
        )


def _optimizer_post_hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    clear_cache()  # the weights changed; release the step's rounded operands


_installed = False


def install() -> None:
    """Drop the cache after every ``optimizer.step()`` (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_optimizer_post_hook)
