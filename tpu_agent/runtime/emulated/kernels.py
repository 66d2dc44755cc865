"""Running one ATen op on CPU data as the TPU would: the one place where Strict dispatch and the DeferAndFuse
CPU executor execute an op, so both give the same numbers and the same errors.

1. MXU operands are rounded as TorchTPU's MXU rounds them (:mod:`mxu`).
2. Inputs the CPU kernel refuses but the device accepts are computed another way (:mod:`cpu_gaps`).
3. A kernel's error is the device's error: CPU kernel names (``histogram_cpu``,
   ``_scaled_dot_product_flash_attention_for_cpu``) are replaced by the op the program called.
"""

from __future__ import annotations

import re
from typing import Any

from tpu_agent.runtime.emulated import cpu_gaps, mxu, ops, state

# "histogram_cpu", "lu_cpu", "_scaled_dot_product_flash_attention_for_cpu", "upsample_nearest2d_channels_last"
_CPU_KERNEL_NAME = re.compile(r"\b_?[a-z][a-z0-9_]*?(?:_for_cpu|_cpu|_channels_last)\b")


def op_name(func: Any) -> str:
    """``torch.histc``-style name of an ATen overload, as the user would recognise it."""
    return func._schema.name.removeprefix("aten::")


def device_error(func: Any, error: Exception) -> Exception:
    """``error`` as the device reports it: the same type, CPU kernel names replaced by the op's name."""
    text = str(error)
    cleaned = _CPU_KERNEL_NAME.sub(op_name(func), text)
    if cleaned == text:
        return error
    try:
        replacement = type(error)(cleaned)
    except Exception:  # noqa: BLE001 - an exception type with a custom constructor keeps its own text
        return error
    return replacement


def run_on_cpu(
    func: Any,
    cargs: list,
    ckwargs: dict,
    precision: state.Precision,
    args: Any = None,
    plan: ops.OpPlan | None = None,
    versions: tuple | None = None,
) -> Any:
    """Execute one op on CPU data as the TPU would. ``args`` are the op's original (tpu) arguments, parallel
    to ``cargs`` (they let the MXU rounding reuse a weight's rounded copy); ``plan`` is ``func``'s, when the
    caller has it; ``versions`` are the MXU operands' base version counters as of the op, when it runs later
    than it was issued (:func:`mxu.round_operand`), parallel to ``plan.mxu_operands``."""
    if plan is None:
        plan = ops.plan_of(func)
    positions = plan.mxu_operands
    if positions is not None:
        if plan.same_dtype is not None:
            mxu.check_operands(plan.same_dtype, cargs)
        if precision is not state.Precision.HIGHEST:
            cargs = list(cargs)
            for n, p in enumerate(positions):
                if p < len(cargs):
                    operand = args[p] if args is not None else None
                    cargs[p] = mxu.mxu_operand(cargs[p], precision, operand, versions[n] if versions else None)
    if plan.gap is not None:
        return cpu_gaps.compute(plan.gap, func, cargs, ckwargs)
    return plan.call(*cargs, **ckwargs)
