"""torch.profiler's Chrome trace (written by the capture hook) as :class:`~tpu_agent.profile.model.Op` s.

From each ``cpu_op`` event of the trace torch exports (``*.pt.trace.json``) this keeps name, wall-clock
start and duration in nanoseconds (``baseTimeNanoseconds`` plus the event's microseconds: the
``time.time_ns`` clock, so ops line up with the runtime event log), thread, input shapes and dtypes, and
for the few ops whose arguments matter (convolution, dtype casts) the concrete inputs. FLOPs and bytes are
computed here from the shapes (torch 2.13 does not record them), on kernels only (``Op.costed``) so that
``aten::linear`` and its ``aten::addmm`` child are not counted twice.

A graph the XLA compiler ran is one :data:`XLA_EXECUTABLE_RECORD` holding a record per ATen op of the graph
(written by :mod:`tpu_agent.runtime.xla.op_records`), as the eager compiler's dispatcher records them one by one:
those ops carry no time of their own, so the executable's measured time is spread over them by their cost.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tpu_agent.profile.model import Op
from tpu_agent.profile.op_classes import CONV_OPS, MXU_OPS
from tpu_agent.runtime.events import XLA_EXECUTABLE_RECORD

DTYPE_BYTES: dict[str, int] = {
    "float": 4,
    "double": 8,
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
# The emulation's CPU does about this many FLOPs in the time it moves a byte from memory (~100 GFLOP/s against
# ~10 GB/s per core): how the executable's time is split, a matmul by its FLOPs, an elementwise op by its bytes.
_CPU_FLOPS_PER_BYTE = 8.0


def _numel(dims: list[int]) -> int:
    return math.prod(dims) if dims else 1


def matmul_dims(op: Op) -> tuple[int, int, int, int] | None:
    """``(batch, M, K, N)`` of a matmul op from its input shapes, or ``None`` if it is not one."""
    shapes = op.input_shapes
    if op.name == "aten::mm" and len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        return 1, m, k, n
    if op.name == "aten::addmm" and len(shapes) >= 3 and len(shapes[1]) == 2 and len(shapes[2]) == 2:
        (m, k), (_, n) = shapes[1], shapes[2]
        return 1, m, k, n
    if op.name == "aten::bmm" and len(shapes) >= 2 and len(shapes[0]) == 3 and len(shapes[1]) == 3:
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
        return b, m, k, n
    if op.name == "aten::baddbmm" and len(shapes) >= 3 and len(shapes[1]) == 3 and len(shapes[2]) == 3:
        (b, m, k), (_, _, n) = shapes[1], shapes[2]
        return b, m, k, n
    return None


def _shape(dims: object) -> list[int]:
    """An input's dims; a tensor list (``[[2, 3], [2, 3]]``) becomes one flat shape of its total size."""
    if not isinstance(dims, list) or not dims or type(dims[0]) is int:
        return dims if isinstance(dims, list) else []
    return [sum(_numel(_shape(d)) for d in dims if isinstance(d, list))]


def _int_list(text: str) -> list[int]:
    text = text.strip().strip("[]")
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def _conv_flops_and_out(op: Op) -> tuple[float, int]:
    """FLOPs and output elements of ``aten::convolution`` from input/weight shapes and its stride/padding."""
    shapes, concrete = op.input_shapes, op.concrete_inputs
    if len(shapes) < 2 or len(shapes[0]) < 3 or len(concrete) < 9:
        return 0.0, 0
    inp, weight = shapes[0], shapes[1]
    stride, padding, dilation = _int_list(concrete[3]), _int_list(concrete[4]), _int_list(concrete[5])
    spatial = len(inp) - 2
    out_spatial = []
    for i in range(spatial):
        s = stride[i] if i < len(stride) else 1
        p = padding[i] if i < len(padding) else 0
        d = dilation[i] if i < len(dilation) else 1
        out_spatial.append((inp[2 + i] + 2 * p - d * (weight[2 + i] - 1) - 1) // s + 1)
    out_elems = inp[0] * weight[0] * _numel(out_spatial)
    return 2.0 * out_elems * _numel(weight[1:]), out_elems


def cost(op: Op) -> tuple[float, float]:
    """FLOPs and HBM bytes of a leaf op: inputs read plus output written (the largest input for others)."""
    itemsize = [DTYPE_BYTES.get(t, 4) for t in op.input_dtypes]
    in_bytes = sum(_numel(d) * itemsize[i] for i, d in enumerate(op.input_shapes) if d and i < len(itemsize))
    dims = matmul_dims(op)
    if dims is not None:
        b, m, k, n = dims
        return 2.0 * b * m * k * n, in_bytes + b * m * n * (itemsize[-1] if itemsize else 4)
    if op.name in CONV_OPS:
        flops, out_elems = _conv_flops_and_out(op)
        return flops, in_bytes + out_elems * (itemsize[0] if itemsize else 4)
    largest = max(
        (_numel(d) * itemsize[i] for i, d in enumerate(op.input_shapes) if d and i < len(itemsize)), default=0
    )
    return 0.0, float(in_bytes + largest)


def _mark_nesting(ops: list[Op]) -> None:
    """Set ``top_level`` and ``costed`` per thread from interval nesting (ops are sorted by thread, start).

    Costed ops are the kernels a device would run: matmuls/convolutions (their helper children such as
    ``aten::copy_`` belong to them) and leaf ops outside any matmul.
    """
    stack: list[tuple[Op, bool]] = []  # (op, whether it or an ancestor is a matmul)
    thread = None
    for op in ops:
        if op.thread != thread:
            stack, thread = [], op.thread
        while stack and stack[-1][0].start_ns + stack[-1][0].duration_ns <= op.start_ns:
            stack.pop()
        is_matmul = op.name in MXU_OPS
        inside = bool(stack) and stack[-1][1]
        op.top_level = not stack
        if stack and stack[-1][0].name not in MXU_OPS:
            stack[-1][0].costed = False  # has a child: its children are the kernels
        op.costed = not inside
        stack.append((op, inside or is_matmul))


OPS_NEEDING_CONCRETE_INPUTS = CONV_OPS | {"aten::_to_copy", "aten::to"}


# The dispatcher's record of entering a tensor subclass's __torch_dispatch__ (the emulated device's): not an op,
# and left in it would make every device op a parent whose kernel is this empty child.
PYTHON_DISPATCH_RECORD = "PythonSubclass"


def _parse_ops(path: Path) -> list[Op]:
    with gc_paused():
        return _build_ops(json.loads(path.read_text(encoding="utf-8")))


def well_typed(op: Op) -> bool:
    """Whether the fields :func:`_build_ops` copies from the trace unconverted have their types (the others are
    computed, and a wrong input there raises while they are): a trace is untrusted input, and ~10^4 ops are
    checked this way far faster than by a generic type walk."""
    return (
        type(op.name) is str
        and type(op.thread) is int
        and all(type(shape) is list and all(type(d) is int for d in shape) for shape in op.input_shapes)
        and all(type(t) is str for t in op.input_dtypes)
        and all(type(c) is str for c in op.concrete_inputs)
    )


def trace_document(ops: list[Op], base_ns: int) -> dict[str, Any]:
    """The part of Kineto's Chrome trace format :func:`read_ops` reads, for ``ops`` (synthetic captures)."""
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": op.name,
            "pid": 1,
            "tid": op.thread,
            "ts": (op.start_ns - base_ns) / 1000,
            "dur": op.duration_ns / 1000,
            "args": {
                "Input Dims": op.input_shapes,
                "Input type": op.input_dtypes,
                "Concrete Inputs": op.concrete_inputs,
            },
        }
        for op in ops
    ]
    return {"schemaVersion": 1, "baseTimeNanoseconds": base_ns, "traceEvents": events}


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Tens of thousands of small containers, none of them cyclic: without this the collector would scan the
    whole heap several times over while they are built (in a process that holds torch, a large one)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build_ops(trace: dict[str, Any]) -> list[Op]:
    base = int(trace.get("baseTimeNanoseconds", 0))
    ops: list[Op] = []
    append = ops.append
    for event in trace["traceEvents"]:
        if event.get("cat") != "cpu_op" or event.get("ph") != "X" or event["name"] == PYTHON_DISPATCH_RECORD:
            continue
        name = event["name"]
        args = event.get("args", {})
        append(
            Op(
                name=name,
                start_ns=base + round(event["ts"] * 1000),
                duration_ns=round(event["dur"] * 1000),
                thread=event["tid"],
                # Plain tensor shapes (nearly all) as they are; only tensor lists need flattening.
                input_shapes=[
                    d if type(d) is list and (not d or type(d[0]) is int) else _shape(d)
                    for d in args.get("Input Dims", ())
                ],
                input_dtypes=args.get("Input type", []),
                concrete_inputs=args.get("Concrete Inputs", []) if name in OPS_NEEDING_CONCRETE_INPUTS else [],
            )
        )
    ops.sort(key=lambda o: (o.thread, o.start_ns, -o.duration_ns))
    _mark_nesting(ops)
    for op in ops:
        if op.costed:
            op.flops, op.bytes = cost(op)
    _spread_executable_time(ops)
    ops.sort(key=lambda o: o.start_ns)
    return ops


def _spread_executable_time(ops: list[Op]) -> None:
    """Lay each XLA executable's ops (ops sorted by thread, start) end to end over the executable's interval,
    each taking a share of its time proportional to its cost: the time XLA's fused program took, as far as it
    can be told apart, so time shares (matmul time, PR-1's saving) mean what they mean on the eager path."""
    for index, executable in enumerate(ops):
        if executable.name != XLA_EXECUTABLE_RECORD:
            continue
        end = executable.start_ns + executable.duration_ns
        children = []
        for child in ops[index + 1 :]:
            if child.thread != executable.thread or child.start_ns >= end:
                break
            children.append(child)
        weights = [max(child.flops, child.bytes * _CPU_FLOPS_PER_BYTE, 1.0) for child in children]
        total, done = sum(weights), 0.0
        for child, weight in zip(children, weights, strict=True):
            start = executable.start_ns + round(executable.duration_ns * done / total)
            done += weight
            child.start_ns = start
            child.duration_ns = executable.start_ns + round(executable.duration_ns * done / total) - start


_preloaded: dict[Path, tuple[tuple[int, int], list[Op]]] = {}
_preload_lock = threading.Lock()


def _identity(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


def preload_ops(path: Path) -> None:
    """Parse one rank's trace ahead of :func:`read_ops` (``profile`` does this while the script is still
    running: the capture hook writes the file when the measured window ends, long before the script exits)."""
    identity = _identity(path)
    ops = _parse_ops(path)
    with _preload_lock:
        _preloaded[path.resolve()] = (identity, ops)


def read_ops(path: Path) -> list[Op]:
    """Load one rank's ops from its trace, with nesting, FLOPs and bytes filled in, sorted by start time.

    A copy parsed by :func:`preload_ops` is used (once) if the file has not changed since.
    """
    with _preload_lock:
        cached = _preloaded.pop(path.resolve(), None)
    if cached is not None and cached[0] == _identity(path):
        return cached[1]
    return _parse_ops(path)
