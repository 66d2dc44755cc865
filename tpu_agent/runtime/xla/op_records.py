"""What torch.profiler sees of a graph XLA ran: one record per ATen op, with the shapes, strides and dtypes of
its inputs, as the dispatcher records an op that runs eagerly.

Run op by op (the eager compiler), every op of a captured graph reaches the profiler through the dispatcher;
run as one XLA executable, none does, and a profile of the same program would see no matmul, no dtype cast and
no shape. The profile's shape, precision and alignment rules would then judge a different program depending on
the compiler (SH-1 read the host-side padding op's varying input instead of the model's static matmuls). While
a profiler records, :func:`run_recorded` wraps the executable's run in an :data:`XLA_EXECUTABLE_RECORD` record
and, inside it after the run, opens one record per op of the graph. Their timing is not measurable (XLA fuses
them): the profile reader spreads the executable's measured time over them by their cost
(:func:`tpu_agent.profile.kineto.read_ops`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from tpu_agent.runtime.events import XLA_EXECUTABLE_RECORD

T = TypeVar("T")

# An op of the graph as the profiler records it: its ATen name and its inputs in schema order, tensors as meta
# tensors (the profiler reads their shape, strides and dtype) and every other argument as the value it had.
OpRecord = tuple[str, list[Any]]


def profiling() -> bool:
    """Whether a torch profiler records on this thread now (a C++ flag: cheap enough to ask at every run)."""
    return bool(torch._C._autograd._profiler_enabled())


def op_records(gm: torch.fx.GraphModule, args: Sequence[torch.Tensor | float]) -> list[OpRecord]:
    """The records of ``gm``'s ATen ops when it runs on ``args``: the graph is run once on fake tensors of the
    args' shapes and dtypes (no data touched), each op's inputs taken as it receives them. An op whose shape
    cannot be inferred (a data-dependent output) ends the list there: the ops before it are still recorded."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with unset_fake_temporarily():
        fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    recorder = _Recorder(gm)
    # the fake run's own ops are not the program's: the profiler must not record them
    torch._C._autograd._enable_record_function(False)
    try:
        with mode:
            recorder.run(*fakes)
    except Exception:  # noqa: BLE001 - a profile must never break the run: keep the ops inferred so far
        pass
    finally:
        torch._C._autograd._enable_record_function(True)
    return recorder.records


class _Recorder(torch.fx.Interpreter):
    """Runs a graph on fake tensors, noting each ATen op with its inputs in the order of the op's schema."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.records: list[OpRecord] = []

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if isinstance(target, torch._ops.OpOverload):
            self.records.append((target._schema.name, _schema_inputs(target, args, kwargs)))
        return super().call_function(target, args, kwargs)


def _schema_inputs(target: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """The op's arguments in schema order, defaults filled in (what the dispatcher hands the profiler: eager
    ``aten::addmm`` records five inputs, bias, both operands, beta and alpha, whatever the call spelled)."""
    inputs = []
    for position, argument in enumerate(target._schema.arguments):
        if position < len(args):
            value = args[position]
        elif argument.name in kwargs:
            value = kwargs[argument.name]
        else:
            value = argument.default_value if argument.has_default_value() else None
        inputs.append(_recordable(value))
    return inputs


def _recordable(value: Any) -> Any:
    """``value`` as a profiler record input: a tensor as a meta tensor of its shape, strides and dtype (kept
    alive by the record list, unlike the fake tensor's mode), a tensor list element-wise, a scalar, dtype or
    int list as itself, and anything else (a device, a layout) as nothing, as the dispatcher records them."""
    if isinstance(value, torch.Tensor):
        with unset_fake_temporarily():
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, torch.Tensor) for v in value):
            return [_recordable(v) for v in value]
        if all(isinstance(v, (int, float, bool)) for v in value):
            return list(value)
        return None
    if isinstance(value, (int, float, bool, str, torch.dtype)):
        return value
    return None


def run_recorded(graph: str, run: Callable[[], T], records: Sequence[OpRecord]) -> T:
    """``run()`` inside an executable record naming ``graph``, followed (inside it) by one record per op."""
    record = torch._C._profiler._RecordFunctionFast
    with record(XLA_EXECUTABLE_RECORD, [], {"graph": graph}):
        result = run()
        for name, inputs in records:
            with record(name, inputs, {}):
                pass
    return result
