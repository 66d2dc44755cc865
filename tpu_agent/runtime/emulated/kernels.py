"""Running one ATen op on CPU data as the TPU would: the one place where Strict dispatch and the DeferAndFuse
CPU executor execute an op, so both give the same numbers and the same errors.

1. MXU operands are rounded as TorchTPU's MXU rounds them (:mod:`mxu`).
2. Inputs the CPU kernel refuses but the device accepts are computed another way (:mod:`cpu_gaps`).
3. A kernel's error is the device's error: CPU kernel names (``histogram_cpu``,
   ``_scaled_dot_product_flash_attention_for_cpu``) are replaced by the op the program called.
4. A random op draws from a device generator: the one the program passed (``torch.Generator("tpu")``), else the
   device's default (:data:`generator.default`), not torch's CPU one: given to an op that takes one, swapped in
   for the CPU default around one that does not (``native_dropout``, ``rand_like``, the fused attention ops). A
   CPU generator the program passed is used as it is. Which is which is read from the op's
   schema once per overload (:func:`draw_of`); non-random ops pay nothing, since the dispatcher calls their
   kernels directly.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from tpu_agent.runtime.emulated import cpu_gaps, generator, mxu, ops, state

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
    draw = draw_of(func)
    if draw is not None and not _tracing():
        if draw.generator_at is not None:
            given = draw.given(cargs, ckwargs)
            source = generator.default if given is None else generator.device_generator_of(given)
            if source is not None:  # else a CPU generator: the program's own stream, used as it is
                if given is None:
                    cargs, ckwargs = draw.with_generator(cargs, ckwargs, source)
                return _draw_from(source, plan, func, cargs, ckwargs)
        elif not draw.drops_nothing(cargs, ckwargs):
            return _call_on_device_stream(plan, func, cargs, ckwargs)
    return _call(plan, func, cargs, ckwargs)


def _call(plan: ops.OpPlan, func: Any, cargs: list, ckwargs: dict) -> Any:
    if plan.gap is not None:
        return cpu_gaps.compute(plan.gap, func, cargs, ckwargs)
    return plan.call(*cargs, **ckwargs)


class Draw:
    """How a random op (tagged ``nondeterministic_seeded``) is given the device generator: the schema position of
    its ``generator`` argument, or for an op without one the position of its ``dropout_p`` (at zero, the fused
    attention ops draw nothing and need no swap)."""

    __slots__ = ("generator_at", "dropout_at")

    def __init__(self, func: Any) -> None:
        names = [argument.name for argument in func._schema.arguments]
        self.generator_at = names.index("generator") if "generator" in names else None
        self.dropout_at = names.index("dropout_p") if "dropout_p" in names else None

    def given(self, args: Any, kwargs: dict) -> Any:
        """The generator the program passed, None for none (the dispatcher leaves out an argument at its default:
        a kwarg-only or trailing ``generator=None`` is absent, not None)."""
        at = self.generator_at
        assert at is not None
        return args[at] if at < len(args) else kwargs.get("generator")

    def with_generator(self, args: Any, kwargs: dict, given: Any) -> tuple[list, dict]:
        """The arguments with ``given`` as the generator: by position where the program passed one there
        (``poisson``, ``_fused_dropout``), else by keyword."""
        at = self.generator_at
        assert at is not None
        if at < len(args):
            args = list(args)
            args[at] = given
            return args, kwargs
        return list(args), {**kwargs, "generator": given}

    def pinned(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The arguments of a recorded op with the device generator itself in place of the dispatcher's wrapper
        of it (see :mod:`generator`), which would not keep a generator the program dropped (``generator=
        torch.Generator("tpu").manual_seed(3)``) alive until the op runs."""
        given = self.given(args, kwargs)
        source = None if given is None else generator.device_generator_of(given)
        if source is None or source is given:
            return args, kwargs
        pinned_args, pinned_kwargs = self.with_generator(args, kwargs, source)
        return tuple(pinned_args), pinned_kwargs

    def drops_nothing(self, cargs: list, ckwargs: dict) -> bool:
        at = self.dropout_at
        if at is None:
            return False
        value = cargs[at] if at < len(cargs) else ckwargs.get("dropout_p", 0.0)
        return value == 0


_DRAWS: dict[int, Draw | None] = {}


def draw_of(func: Any) -> Draw | None:
    """``func``'s :class:`Draw`, None for an op that draws no random numbers; read once per overload (keyed by
    identity: overloads live as long as the process)."""
    try:
        return _DRAWS[id(func)]
    except KeyError:
        random = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
        draw = _DRAWS[id(func)] = Draw(func) if random else None
        return draw


def _tracing() -> bool:
    """Whether the op is being recorded into a graph (the DeferAndFuse trace XLA compiles), not run: the
    executable draws its own key then (``lowering._next_seed``), and a generator object has no place in it."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is not None


def _call_on_device_stream(plan: ops.OpPlan, func: Any, cargs: list, ckwargs: dict) -> Any:
    """Run an op that takes no generator argument with torch's CPU default generator seeded for the device
    generator's next draw; the CPU's state is restored after (a few microseconds: a 5 KB state copy)."""
    cpu = torch.default_generator
    saved = cpu.get_state()
    try:
        return _draw_from(generator.default, plan, func, cargs, ckwargs, cpu)
    finally:
        cpu.set_state(saved)


def _draw_from(
    source: generator.DeviceGenerator, plan: ops.OpPlan, func: Any, cargs: list, ckwargs: dict, engine: Any = None
) -> Any:
    """Run a random op on the engine (``source``'s own, or ``engine``) seeded for ``source``'s next draw, then
    move ``source``'s offset past the numbers the op drew."""
    source.reseed_engine(engine)
    out = _call(plan, func, cargs, ckwargs)
    source.advance(_drawn(out))
    return out


def _drawn(out: Any) -> int:
    """How many random numbers an op drew, as its largest output holds (Philox's offset counts them); none when
    it ran on tracing tensors (the fake and functional tensors of Dynamo and AOTAutograd tracing a compiled
    function, meta tensors: a real result is a plain CPU tensor), which draw nothing."""
    tensors = [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]
    if not tensors or type(tensors[0]) is not torch.Tensor or tensors[0].is_meta:
        return 0
    return max(t.numel() for t in tensors)
