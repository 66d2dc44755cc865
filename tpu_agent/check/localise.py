"""Finding where a mismatch or error starts: the first diverging submodule, then the op inside it.

1. Forward hooks on every submodule record, during one CPU forward, each call's inputs (copied) and which
   call it was nested in, giving the call tree as it actually ran (a shared module called from several
   places appears once per call).
2. Starting at the model, each child call is replayed alone, forward and backward, on CPU and on the ``tpu``
   device (compiled when the mode is ``compile``) with the recorded CPU inputs. The first child that diverges
   (or raises) is descended into; the module none of whose children diverge is the culprit. Replaying with
   CPU inputs means the culprit is the module that *introduces* the difference, not one that inherits it.
3. The culprit is replayed once more under a ``TorchDispatchMode`` that records every aten op, forward and
   backward, with its outputs and the model source line that called it. The two op streams are aligned by op
   name and the first op whose outputs differ (or that raises on ``tpu``) is reported.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_agent.check.compare import TOLERANCES, TensorDiff, Tolerance, compare_named, flatten_tensors
from tpu_agent.check.execute import (
    StepResult,
    describe_frame,
    is_model_frame,
    run_step,
    settle,
    tree_to,
)
from tpu_agent.check.model import Localisation

MAX_DEPTH = 32
Invocation = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass
class ModuleCall:
    """One call of a submodule during the recorded CPU forward."""

    name: str
    module_type: str
    invocation: Invocation
    children: list[ModuleCall] = field(default_factory=list)


def record_calls(model: Any, invocation: Invocation) -> ModuleCall:
    """Run ``model`` forward once on CPU with hooks on every submodule; return the call tree under the root."""
    import torch

    root = ModuleCall("", type(model).__name__, invocation)
    stack = [root]
    handles = []

    def make_hooks(name: str) -> tuple[Callable[..., None], Callable[..., None]]:
        def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            call = ModuleCall(name, type(module).__name__, tree_to((args, kwargs), "cpu"))
            stack[-1].children.append(call)
            stack.append(call)

        def after(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if len(stack) > 1:
                stack.pop()

        return before, after

    try:
        for name, module in model.named_modules():
            if name:
                before, after = make_hooks(name)
                handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
                handles.append(module.register_forward_hook(after, with_kwargs=True))
        with torch.no_grad():
            args, kwargs = invocation
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return root


@dataclass
class Verdict:
    """One replay's outcome: the first differing tensor, or the tpu error; ``None`` fields mean it matched."""

    diff: TensorDiff | None = None
    kind: str = ""  # forward | backward | error
    error: str = ""

    @property
    def diverges(self) -> bool:
        return bool(self.kind)


def judge(got: StepResult, ref: StepResult, table: Mapping[str, Tolerance] = TOLERANCES) -> Verdict:
    """Compare a tpu step with the CPU step of the same call, under the mode's tolerance ``table``."""
    if ref.error is not None:
        return Verdict()  # the call does not run on CPU on its own; it cannot be judged in isolation
    if got.error is not None:
        return Verdict(kind="error", error=f"{got.error.type}: {got.error.message.splitlines()[0]}")
    for kind, got_tensors, ref_tensors in (
        ("forward", got.outputs, ref.outputs),
        ("backward", got.gradients, ref.gradients),
    ):
        failing = [diff for diff in compare_named(got_tensors, ref_tensors, table=table) if not diff.ok]
        if failing:
            return Verdict(failing[0], kind)
    return Verdict()


def _replay(
    call: ModuleCall,
    cpu_model: Any,
    tpu_model: Any,
    device: Any,
    prepare: Callable[[Any], Any],
    table: Mapping[str, Tolerance],
) -> Verdict:
    cpu_module = cpu_model.get_submodule(call.name) if call.name else cpu_model
    tpu_module = tpu_model.get_submodule(call.name) if call.name else tpu_model
    ref = run_step(cpu_module, call.invocation, "cpu", "cpu")
    got = run_step(prepare(tpu_module), call.invocation, device, "tpu", parameters=dict(tpu_module.named_parameters()))
    leftover_error = settle(device)
    if got.error is None and leftover_error is not None:
        got.error = leftover_error
    return judge(got, ref, table)


# ---- op level ---------------------------------------------------------------------------------------------


@dataclass
class OpRecord:
    name: str
    location: str
    outputs: dict[str, Any] | None  # None: the op raised
    error: str = ""


def _host_copy(tensor: Any) -> Any:
    """A CPU copy made by ``copy_`` into a CPU tensor: inside a dispatch-mode handler under DeferAndFuse, the
    emulation's ``.to("cpu")`` hands back a deferred ``tpu`` tensor, while ``copy_`` always materialises."""
    import torch

    return torch.empty(tensor.shape, dtype=tensor.dtype).copy_(tensor.detach())


def _op_recorder() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpRecorder(TorchDispatchMode):
        """Records each aten op's outputs (copied to CPU) and the model source line that issued it."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: list[OpRecord] = []

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch keeps Dynamo out of a mode's handler by wrapping it, which imports Dynamo at the first op
            # (seconds of CPU in a Strict or DeferAndFuse worker); a process without Dynamo compiles nothing
            return "torch._dynamo" in sys.modules

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            frames = [frame for frame in traceback.extract_stack() if is_model_frame(frame.filename)]
            location = describe_frame(frames[-1]) if frames else ""
            name = str(func.name() if hasattr(func, "name") else func)
            try:
                out = func(*args, **(kwargs or {}))
                # copied within the try: under DeferAndFuse an op's own failure surfaces only when it runs
                outputs = {key: _host_copy(t) for key, t in flatten_tensors(out)}
            except Exception as error:
                self.ops.append(
                    OpRecord(
                        name,
                        location,
                        None,
                        f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                    )
                )
                raise
            self.ops.append(OpRecord(name, location, outputs))
            return out

    return OpRecorder()


def _trace(module: Any, invocation: Invocation, device: Any, stage: str) -> list[OpRecord]:
    recorder = _op_recorder()
    with recorder:
        run_step(module, invocation, device, stage)
    return recorder.ops


def first_diverging_op(
    cpu_ops: list[OpRecord], tpu_ops: list[OpRecord], table: Mapping[str, Tolerance] = TOLERANCES
) -> tuple[OpRecord, str] | None:
    """The first tpu op that raises or whose outputs differ from its CPU counterpart, with a description.

    Ops are paired by name and calling source line, in order. A tpu op with no CPU counterpart comes from a
    device-dependent branch in the model's code; it is reported when the values diverge after it, since
    that branch is then the likeliest cause.
    """
    position = 0
    tpu_only: OpRecord | None = None
    for op in tpu_ops:
        if op.outputs is None:
            return op, f"raises on tpu: {op.error}"
        match = next(
            (
                i
                for i in range(position, len(cpu_ops))
                if (cpu_ops[i].name, cpu_ops[i].location) == (op.name, op.location)
            ),
            None,
        )
        if match is None:
            if op.location:  # ops of the check's own harness (moving inputs to the device) have no model line
                tpu_only = tpu_only or op
            continue
        position = match + 1
        reference = cpu_ops[match]
        if reference.outputs is None:
            continue
        failing = [diff for diff in compare_named(op.outputs, reference.outputs, table=table) if not diff.ok]
        if failing:
            if tpu_only is not None:
                return (
                    tpu_only,
                    f"issued on tpu only (a device-dependent branch); values differ after it: {failing[0].describe()}",
                )
            return op, failing[0].describe() + (_TIE_ORDER if _only_tie_order(op, failing) else "")
    return None


# ops that pick values and return where they were: equal values (ties) may come back in another order
_SELECTING_OPS = frozenset(
    {
        "aten::topk",
        "aten::sort",
        "aten::max",
        "aten::min",
        "aten::kthvalue",
        "aten::mode",
        "aten::median",
        "aten::nanmedian",
        "aten::cummax",
        "aten::cummin",
    }
)
_TIE_ORDER = (
    "; the values match and only the indices differ: equal values (ties) come back in another order, as XLA on a"
    " TPU returns the lowest index first where the CPU kernel may not. Not a device error: exact ties (a"
    " zero-initialised router, a random-init model) route or sort differently on the two; trained weights rarely tie"
)


def _only_tie_order(op: OpRecord, failing: list[TensorDiff]) -> bool:
    """Whether a selecting op's outputs differ only in their indices (its values all matched)."""
    outputs = op.outputs or {}
    if op.name.split(".")[0] not in _SELECTING_OPS or not any(t.is_floating_point() for t in outputs.values()):
        return False
    return all(diff.name in outputs and not outputs[diff.name].is_floating_point() for diff in failing)


# ---- descent ---------------------------------------------------------------------------------------------


def localise(
    cpu_model: Any,
    tpu_model: Any,
    invocation: Invocation,
    device: Any,
    prepare: Callable[[Any], Any] = lambda module: module,
    compiled: bool = False,
    table: Mapping[str, Tolerance] = TOLERANCES,
) -> Localisation | None:
    """The first diverging submodule of ``tpu_model`` (a copy of ``cpu_model`` on ``device``) and its op, judged
    under the mode's tolerance ``table``.

    ``prepare`` wraps a tpu submodule before it runs (``torch.compile`` in compile mode). Returns ``None``
    when the recorded CPU forward itself fails, or when no replay diverges (the divergence then needs the
    whole model's context, e.g. state carried across calls).
    """
    try:
        root = record_calls(cpu_model, invocation)
    except Exception:  # the hooked CPU forward fails: the model cannot be taken apart this way
        return None
    verdict = _replay(root, cpu_model, tpu_model, device, prepare, table)
    if not verdict.diverges:
        return None
    culprit, depth = root, 0
    while depth < MAX_DEPTH:
        depth += 1
        for child in culprit.children:
            child_verdict = _replay(child, cpu_model, tpu_model, device, prepare, table)
            if child_verdict.diverges:
                culprit, verdict = child, child_verdict
                break
        else:
            break
    detail = verdict.error or (verdict.diff.describe() if verdict.diff else "")
    result = Localisation(culprit.name, culprit.module_type, verdict.kind, detail)
    cpu_module = cpu_model.get_submodule(culprit.name) if culprit.name else cpu_model
    tpu_module = tpu_model.get_submodule(culprit.name) if culprit.name else tpu_model
    try:
        found = first_diverging_op(
            _trace(cpu_module, culprit.invocation, "cpu", "cpu"),
            _trace(tpu_module, culprit.invocation, device, "tpu"),
            table,
        )
    except Exception as error:  # the recorder itself could not run this module; the module verdict stands
        result.note = f"op-level trace failed: {type(error).__name__}: {error}"[:300]
        return result
    if found is not None:
        op, description = found
        result.op, result.op_location, result.op_detail = op.name, op.location, description
        if compiled:
            result.note = "op found by replaying the module eagerly; it diverges in eager mode too"
    elif verdict.kind == "error":
        how = "torch.compile's graph raises it" if compiled else "it comes from the module's Python code"
        result.note = f"no aten op raises when the module is traced op by op: {how}"
    elif compiled:
        result.note = "the module's eager ops all match: the divergence comes from torch.compile's graph"
    else:
        result.note = "no single op differs beyond tolerance: small differences accumulate across the module's ops"
    return result


__all__ = ["ModuleCall", "OpRecord", "first_diverging_op", "judge", "localise", "record_calls"]
