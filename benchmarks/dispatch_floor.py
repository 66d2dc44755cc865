"""The floor of the emulated device's per-op cost: what any Python tensor subclass pays before emulating anything.

Every op on a ``tpu`` tensor reaches a Python ``__torch_dispatch__`` that unwraps the CPU data, runs the CPU
kernel and wraps the result in a new tensor object. The cheapest such dispatcher (:func:`bare_dispatch`: unwrap,
call the op, rewrap, map in-place results back to their inputs, nothing else), installed in place of the
emulator's own for the "bare" column, therefore bounds how close the emulation's Strict mode can come to plain
CPU. This script measures, side by side in one process
and interleaved (so that load from other processes hits every column alike):

* one small op (``a + b``, ``a @ b``, ``relu``) per call, in microseconds, on CPU, the bare wrapper, and the
  emulated device in Strict and DeferAndFuse (the latter flushed every 64 ops);
* a training step (forward with labels, backward, AdamW step, ``loss.item()``) of the tiny Hugging Face models
  of ``hf_step_bench.py``, as thread CPU time (best step), for the same four columns.

The bare column uses the emulated device's tensors, so it runs the same op stream as Strict (AdamW included);
the CPU column keeps torch's CPU defaults.

    python benchmarks/dispatch_floor.py [--models llama,bert] [--steps 6] [--warmup 2] [--calls 2000]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from hf_step_bench import BATCH, SEQ, VOCAB, build  # a sibling script: benchmarks/ is sys.path[0]

from tpu_agent.runtime.emulated import tensor
from tpu_agent.runtime.emulated.flush_cause import FlushCause
from tpu_agent.runtime.emulated.tensor import TpuTensor

_make_wrapper = torch.Tensor._make_wrapper_subclass


def bare_dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """The least a wrapper subclass's ``__torch_dispatch__`` can do: unwrap, call the CPU op, rewrap.

    Installed as the ``tpu`` tensor type's dispatcher for the bare column, so the tensors, the device and the
    factory functions are the emulated device's, and only what runs per op differs: no MXU rounding, memory
    accounting, op tables, events or error cleaning."""
    cargs = [_unwrap(a) for a in args]
    ckwargs = {k: _unwrap(v) for k, v in kwargs.items()} if kwargs else {}
    if ckwargs.get("device") is not None:
        ckwargs["device"] = "cpu"
    return _rewrap(func(*cargs, **ckwargs), args, cargs)


def _unwrap(x: Any) -> Any:
    t = type(x)
    if t is TpuTensor:
        return x._elem
    if t is list or t is tuple:
        return t([_unwrap(y) for y in x])
    return x


def _rewrap(out: Any, args: tuple, cargs: list) -> Any:
    t = type(out)
    if t is torch.Tensor:
        for i, c in enumerate(cargs):
            if c is out:  # in-place and out= ops return the caller's tensor
                return args[i]
        r = _make_wrapper(
            TpuTensor,
            out.shape,
            strides=out.stride(),
            storage_offset=out.storage_offset(),
            dtype=out.dtype,
            device=tensor.DEVICE,
        )
        r._elem = out
        return r
    if t is list or t is tuple:
        return t(_rewrap(o, args, cargs) for o in out)
    return out


def set_column(column: str) -> None:
    """Make the process's ``tpu`` device behave as ``column`` does (cpu columns leave it in Strict)."""
    torch.tpu.eager_mode = "defer_and_fuse" if column == "fused" else "strict"
    if column == "bare":
        tensor.set_dispatcher(bare_dispatch)


def _time_calls(op: Callable[[Any, Any], Any], x: Any, y: Any, calls: int, flush_every: int) -> float:
    """Thread CPU seconds per call of ``op(x, y)``; under DeferAndFuse the graph runs every ``flush_every`` calls
    (recording and execution are both counted)."""
    from tpu_agent.runtime.emulated import deferred

    start = time.thread_time()
    for i in range(1, calls + 1):
        op(x, y)
        if flush_every and i % flush_every == 0:
            deferred.flush(FlushCause.SYNCHRONIZE)
    if flush_every:
        deferred.flush(FlushCause.SYNCHRONIZE)
    return (time.thread_time() - start) / calls


def micro(calls: int, rounds: int) -> None:
    """Per-call cost of one small op in every column, best of ``rounds`` interleaved rounds."""
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    columns = {
        "cpu": (a, b),
        "bare": (a.to("tpu"), b.to("tpu")),
        "strict": (a.to("tpu"), b.to("tpu")),
        "fused": (a.to("tpu"), b.to("tpu")),
    }
    ops_: dict[str, Callable[[Any, Any], Any]] = {
        "a + b": lambda x, y: x + y,
        "a @ b": lambda x, y: x @ y,
        "relu(a)": lambda x, y: torch.relu(x),
    }
    print(f"one op on 64x64 f32, microseconds per call (best of {rounds} rounds of {calls} calls)")
    print(f"{'op':<10}" + "".join(f"{c:>10}" for c in columns) + f"{'bare/cpu':>10}{'strict/cpu':>12}{'fused/cpu':>11}")
    for name, op in ops_.items():
        best = dict.fromkeys(columns, float("inf"))
        for _ in range(rounds):
            for column, (x, y) in columns.items():
                set_column(column)
                flush_every = 64 if column == "fused" else 0
                best[column] = min(best[column], _time_calls(op, x, y, calls, flush_every))
                set_column("cpu")
        us = {c: v * 1e6 for c, v in best.items()}
        print(
            f"{name:<10}"
            + "".join(f"{us[c]:>10.1f}" for c in columns)
            + f"{us['bare'] / us['cpu']:>9.2f}x{us['strict'] / us['cpu']:>11.2f}x{us['fused'] / us['cpu']:>10.2f}x"
        )


def steps(models: list[str], n_steps: int, warmup: int) -> None:
    """Best training-step thread CPU time per column, steps of all columns interleaved."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    print(f"\ntraining step (thread CPU ms, best of {n_steps} interleaved steps after {warmup} warm-up)")
    print(
        f"{'model':<7}{'cpu':>9}{'bare':>9}{'strict':>9}{'fused':>9}"
        f"{'bare/cpu':>10}{'strict/cpu':>12}{'strict/bare':>13}{'fused/strict':>14}"
    )
    ratios: dict[str, list[float]] = {"bare/cpu": [], "strict/cpu": [], "strict/bare": [], "fused/strict": []}
    for name in models:
        torch.manual_seed(0)
        base = build(name)
        runs: dict[str, tuple] = {}
        for column in ("cpu", "bare", "strict", "fused"):
            if column == "cpu":
                model, ids = copy.deepcopy(base), torch.randint(0, VOCAB, (BATCH, SEQ))
            else:
                model, ids = copy.deepcopy(base).to("tpu"), torch.randint(0, VOCAB, (BATCH, SEQ)).to("tpu")
            runs[column] = (model, ids)
        _, tpu_foreach = _default_to_fused_or_foreach(list(runs["strict"][0].parameters()), False)
        optimizers = {column: torch.optim.AdamW(model.parameters(), lr=1e-3) for column, (model, _) in runs.items()}
        times: dict[str, list[float]] = {column: [] for column in runs}
        for step in range(warmup + n_steps):
            for column, (model, ids) in runs.items():
                set_column(column)
                start = time.thread_time()
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optimizers[column].step()
                optimizers[column].zero_grad(set_to_none=True)
                loss.item()
                if step >= warmup:
                    times[column].append(time.thread_time() - start)
                torch.tpu.eager_mode = "strict"
        ms = {column: min(values) * 1e3 for column, values in times.items()}
        for key in ratios:
            top, bottom = key.split("/")
            ratios[key].append(ms[top] / ms[bottom])
        print(
            f"{name:<7}{ms['cpu']:>9.2f}{ms['bare']:>9.2f}{ms['strict']:>9.2f}{ms['fused']:>9.2f}"
            f"{ms['bare'] / ms['cpu']:>9.2f}x{ms['strict'] / ms['cpu']:>11.2f}x"
            f"{ms['strict'] / ms['bare']:>12.2f}x{ms['fused'] / ms['strict']:>13.2f}x",
            flush=True,
        )
        medians = {column: statistics.median(values) * 1e3 for column, values in times.items()}
        print(f"{'':<7}" + "".join(f"{medians[c]:>9.2f}" for c in runs) + "  (median step)")
    print(f"AdamW on tpu tensors: {'foreach' if tpu_foreach else 'per-parameter'}")
    medians = {key: statistics.median(values) for key, values in ratios.items()}
    print(
        "median over models: " + ", ".join(f"{key} {value:.2f}x" for key, value in medians.items()) + "\n"
        f"Strict can come no closer to CPU than the bare dispatcher ({medians['bare/cpu']:.2f}x); "
        f"the emulation's own work (MXU rounding, memory accounting, op tables) adds {medians['strict/bare']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama,bert")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from tpu_agent.runtime.emulated import activate

    torch.set_num_threads(1)
    activate(eager_mode="strict")
    micro(args.calls, args.rounds)
    steps(args.models.split(","), args.steps, args.warmup)


if __name__ == "__main__":
    main()
