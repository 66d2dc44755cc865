"""The child side of ``tpu-agent estimate``: a runtime hook that watches the script's XLA graphs for a few steps,
then compiles one steady step's graphs for the TPU target and writes the estimate.

The script runs on the emulated device with the XLA compiler (DeferAndFuse graphs and ``torch.compile``
regions both reach :class:`~tpu_agent.runtime.xla.graphs.GraphRunner`). Every graph run is observed with the
storages it reads; each input is given its role by matching that storage against the live modules' parameters
and buffers, their gradients and the optimizers' state. Steps end at ``optimizer.step()``: the graphs run
between the last two step ends are the steady step (with DeferAndFuse the optimizer's update flushes during the
next step, so a whole interval between step ends holds one of each graph). After ``steps`` optimizer steps the
script is stopped (exit code 0) and the hook's finalizer compiles and writes ``estimate.json`` atomically.

Settings come from ``options.json`` in :data:`ESTIMATE_DIR_ENV`, written by :mod:`tpu_agent.estimate.script`.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.estimate import capture_only, host_bound, recompute, views
from tpu_agent.estimate.capture_only import storage_identity
from tpu_agent.estimate.layout import ESTIMATE_DIR_ENV, OPTIONS_FILE, RESULT_FILE
from tpu_agent.estimate.model import ArgRole, ArgSpec, StepProgram
from tpu_agent.estimate.options import DEFAULT_EFFORT, DEFAULT_OPTIMIZER_STEPS, MIN_OPTIMIZER_STEPS
from tpu_agent.runtime import events
from tpu_agent.runtime.emulated.flush_cause import FlushCause

_DONATED_ROLES = (ArgRole.PARAMETER, ArgRole.OPTIMIZER_STATE)
_OWNERS = (torch.nn.Module, torch.optim.Optimizer)


class CaptureComplete(SystemExit):
    """Raised from ``optimizer.step()`` once the steps to watch have run: stops the script with exit code 0."""

    def __init__(self) -> None:
        super().__init__(0)


@dataclass
class ObservedGraph:
    """One distinct graph of a step: how to trace it again, its inputs as shapes and roles, runs per step."""

    runner: Any  # tpu_agent.runtime.xla.graphs.GraphRunner
    precision: Any
    inputs: list[tuple[tuple[int, ...], torch.dtype, int | None] | float]  # shape, dtype, storage address
    calls: int = 1


def _is_fsdp_param(item: object) -> bool:
    """FSDP2's per-parameter state (by class name: importing FSDP2 to check would load it in every capture)."""
    return type(item).__name__ == "FSDPParam"


@dataclass
class _Step:
    """What one optimizer step ran: its compiled graphs, and each DeferAndFuse graph it flushed (name, ops)."""

    graphs: dict[tuple[str, object], ObservedGraph] = field(default_factory=dict)
    flushed: list[tuple[str, int]] = field(default_factory=list)
    # graphs that hold FSDP2's own collective staging (fsdp::chunk_cat and the like): the compiled step partitions
    # and reduces gradients itself, so such a graph not compiling leaves nothing of the step out
    staging: set[str] = field(default_factory=set)


@dataclass
class Coverage:
    """How much of a step the compiled programs hold: ops compiled, ops in all, and each graph left out."""

    ops_compiled: int
    ops: int
    missing: list[str]

    @property
    def share(self) -> float:
        return self.ops_compiled / self.ops if self.ops else 1.0


@dataclass
class _Watcher:
    """State of one capture: storage roles, graphs per step, the step count."""

    steps: int
    roles: dict[int, ArgRole] = field(default_factory=dict)
    current: _Step = field(default_factory=_Step)
    steady: _Step | None = None
    # graphs that ran on the CPU path instead, by name: (ops, why). A graph that failed once is not tried again,
    # so this holds the whole run; a step's flushes say which of them it ran.
    fallbacks: dict[str, tuple[int, str]] = field(default_factory=dict)
    step: int = 0
    bound: host_bound.HostBound | None = None

    def refresh_roles(self) -> None:
        """Storage address -> role, from the live modules and optimizers (rebuilt when an input is unknown).

        Modules are found by walking the heap, not by a module hook: a global forward hook changes what
        ``torch.compile`` traces (Dynamo refuses modules it sees through a hook's closure)."""
        roles: dict[int, ArgRole] = {}

        def put(tensor: Any, role: ArgRole) -> None:
            key = storage_identity(tensor) if isinstance(tensor, torch.Tensor) else None
            if key is not None:
                roles.setdefault(key, role)

        with warnings.catch_warnings():  # isinstance on every live object trips modules' deprecated attributes
            warnings.simplefilter("ignore")
            live = [item for item in gc.get_objects() if isinstance(item, _OWNERS) or _is_fsdp_param(item)]
        for optimizer in (item for item in live if isinstance(item, torch.optim.Optimizer)):
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    put(parameter, ArgRole.PARAMETER)
                    put(parameter.grad, ArgRole.GRADIENT)
            for per_parameter in optimizer.state.values():
                for value in per_parameter.values():
                    put(value, ArgRole.OPTIMIZER_STATE)
        for fsdp_param in (item for item in live if _is_fsdp_param(item)):
            # FSDP2 runs forward and backward on unsharded copies (all-gather outputs) of its sharded parameters
            for tensor in [getattr(fsdp_param, "_unsharded_param", None), *fsdp_param.all_gather_outputs]:
                put(tensor, ArgRole.PARAMETER)
        for module in (item for item in live if isinstance(item, torch.nn.Module)):
            for parameter in module.parameters(recurse=False):
                put(parameter, ArgRole.PARAMETER)
                put(parameter.grad, ArgRole.GRADIENT)
            for buffer in module.buffers(recurse=False):
                put(buffer, ArgRole.OTHER)
        self.roles = roles

    def role_of(self, storage: int | None) -> ArgRole:
        """The role of an input by its storage; anything not a model's or optimizer's tensor is the batch."""
        return ArgRole.OTHER if storage is None else self.roles.get(storage, ArgRole.BATCH)

    def observe(self, runner: Any, inputs: Sequence[torch.Tensor | float], precision: Any) -> None:
        specialisation = tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else float for t in inputs)
        key = (runner.signature, (specialisation, precision))
        seen = self.current.graphs.get(key)
        if seen is not None:
            seen.calls += 1
            return
        # roles are resolved at the end: while a step is in flight, DeferAndFuse leaves tensors written in place
        # without data, so only their storages (stable across in-place updates) are recorded here
        described = [
            (tuple(t.shape), t.dtype, storage_identity(t)) if isinstance(t, torch.Tensor) else float(t) for t in inputs
        ]
        self.current.graphs[key] = ObservedGraph(runner, precision, described)

    def flushed(self, graph: Any) -> None:
        name = f"deferred graph {graph.hash}"
        self.current.flushed.append((name, len(graph.nodes)))
        if any(getattr(node.func, "namespace", "") == "fsdp" for node in graph.nodes):
            self.current.staging.add(name)

    def end_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """A step ends at ``optimizer.step()``: what it recorded is flushed now, so the step's graphs are its own
        whatever the script does next (without a process group and under --capture-only nothing else flushes:
        ``loss.item()`` reads no value there)."""
        from tpu_agent.runtime.emulated import deferred

        deferred.flush(FlushCause.OPTIMIZER_STEP)
        self.step += 1
        if self.step >= 2:  # step 0 builds optimizer state and compiles: never the steady step
            self.steady = self.current
        self.current = _Step()
        if self.step >= self.steps:
            raise CaptureComplete()

    def fell_back(self, graph_name: str, ops: int, error: BaseException) -> None:
        """A graph ran on the CPU path after all: its pieces that did run through XLA are not a program of the
        step (the whole graph ran again on the CPU), so they are dropped and the graph is named instead."""
        self._leave_out(self.current, graph_name, ops, error)

    def trace_graphs(self, step: _Step) -> None:
        """Read each of ``step``'s graphs (capture-only traces a graph when first read): one that cannot be traced
        for XLA (an op without a lowering) is left out and named, as a graph that fell back while running is."""
        for seen in list(step.graphs.values()):
            try:
                seen.runner.gm  # noqa: B018 - the read traces it
            except Exception as error:  # noqa: BLE001 - the graph is left out of the estimate and named there
                self._leave_out(step, str(seen.runner.name), getattr(seen.runner, "ops", 0), error)

    def _leave_out(self, step: _Step, graph_name: str, ops: int, error: BaseException) -> None:
        step.graphs = {
            key: seen for key, seen in step.graphs.items() if not str(seen.runner.name).startswith(graph_name)
        }
        self.fallbacks.setdefault(graph_name, (ops, f"{type(error).__name__}: {str(error)[:200]}"))

    def step_seen(self) -> _Step:
        """The steady step; without two optimizer steps (inference, short scripts), all graphs seen."""
        return self.steady or self.current

    def coverage(self, step: _Step) -> Coverage:
        """Which of ``step``'s ops its compiled programs hold. A DeferAndFuse graph counts when it was compiled
        whole (one split around ops without a lowering is seen only as its pieces, ``name#i``); a torch.compile
        graph by its FX ops; a graph that fell back anywhere in the run is left out with its reason."""
        from tpu_agent.runtime.xla.graphs import op_count

        names = {str(seen.runner.name) for seen in step.graphs.values()}
        left_out: dict[str, tuple[int, str]] = {}  # name -> (ops over the step's runs, why)
        compiled = 0
        for name, ops in step.flushed:
            if name in names:
                compiled += ops
            elif name not in step.staging:
                why = self.fallbacks.get(name, (ops, "split around ops without an XLA lowering"))[1]
                left_out[name] = (left_out.get(name, (0, why))[0] + ops, why)
        flushed = {name for name, _ in step.flushed}
        for seen in step.graphs.values():
            if str(seen.runner.name).split("#")[0] not in flushed:  # a torch.compile graph (or a piece of one)
                compiled += op_count(seen.runner.gm) * seen.calls
        for name, entry in self.fallbacks.items():
            if not name.startswith("deferred graph "):
                left_out[name] = entry
        total = compiled + sum(ops for ops, _ in left_out.values())
        missing = [f"{name} ({ops} ops): {why}" for name, (ops, why) in left_out.items()]
        return Coverage(compiled, total, missing)

    def whole_graphs(self, step: _Step) -> list[ObservedGraph]:
        """The step's compiled programs, without pieces of a DeferAndFuse graph that was not compiled whole."""
        flushed = {name for name, _ in step.flushed}
        return [
            seen
            for seen in step.graphs.values()
            if "#" not in str(seen.runner.name) or str(seen.runner.name).split("#")[0] not in flushed
        ]


def step_program(graph: ObservedGraph, index: int, role_of: Callable[[int | None], ArgRole]) -> StepProgram:
    """A captured graph as a :class:`StepProgram`: the same JAX function the XLA executor runs, traced again
    on shapes only. Python floats the graph reads (learning rate, betas) are fixed at their observed values; a
    packed buffer the graph only reads through views is one input per view (:mod:`.views`)."""
    import jax

    from tpu_agent.runtime.xla import lowering
    from tpu_agent.runtime.xla.graphs import op_count

    gm, inputs = views.unpacked(graph.runner.gm, graph.inputs)
    examples: list[torch.Tensor | float] = [
        torch.empty(item[0], dtype=item[1], device="meta") if isinstance(item, tuple) else item for item in inputs
    ]
    traced = lowering.trace_graph(gm, examples, graph.precision)
    seed = traced.abstract[0]
    args = [ArgSpec("rng_seed", tuple(seed.shape), str(seed.dtype), ArgRole.OTHER)]
    positions: list[int] = []
    for position, (item, abstract) in enumerate(zip(inputs, traced.abstract[1:], strict=True)):
        if isinstance(item, tuple):
            shape, dtype = tuple(abstract.shape), str(abstract.dtype)
            args.append(ArgSpec(f"input{position}", shape, dtype, role_of(item[2]), storage=item[2]))
            positions.append(position)
    floats = {position: item for position, item in enumerate(inputs) if not isinstance(item, tuple)}
    count = len(inputs)

    def program(rng_seed: jax.Array, *arrays: jax.Array) -> Any:
        merged: list[Any] = [None] * count
        for position, array in zip(positions, arrays, strict=True):
            merged[position] = array
        for position, value in floats.items():
            merged[position] = value
        return traced.function(rng_seed, *merged)

    donated = tuple(i for i, arg in enumerate(args) if arg.role in _DONATED_ROLES)
    return StepProgram(f"{index}: {graph.runner.name}", program, tuple(args), donated, graph.calls, op_count(gm))


def _read_options(directory: Path) -> dict[str, Any]:
    options = json.loads((directory / OPTIONS_FILE).read_text())
    if not isinstance(options, dict):
        raise ValueError(f"{directory / OPTIONS_FILE} is not an object")
    return options


def script_error(error: BaseException | None, steps: int, capture_only: bool = False) -> TpuAgentError | None:
    """The script's own exception as the estimate's answer: its type, message and the innermost line of the
    script (or its own modules) that raised it; ``None`` when the script did not raise (it ended, or the capture
    stopped it). A script that fails in its code is not a capture problem and must not read like one."""
    if error is None or isinstance(error, SystemExit) and error.code in (0, None):
        return None
    if isinstance(error.__context__, CaptureComplete):  # raised while unwinding from a complete capture (a finally:)
        return None
    if isinstance(error, SystemExit):
        return TpuAgentError(
            "script-failed",
            f"the script called sys.exit({error.code!r}) after {steps} optimizer step(s), before a step could be "
            "captured",
            "run it with `tpu-agent run` to see why it exits",
            ExitCode.FINDINGS,
        )
    frames = [
        frame for frame in traceback.extract_tb(error.__traceback__) if not events.is_library_file(frame.filename)
    ]
    where = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return TpuAgentError(
        "script-raised",
        f"{where}the script raised {type(error).__name__}: {message} (after {steps} optimizer step(s))",
        "fix the error in the script (`tpu-agent run` shows the whole traceback) and estimate again"
        + (
            "; if `tpu-agent run` runs it, the op failed only without values (capture-only): report it with the script"
            if capture_only
            else ""
        ),
        ExitCode.FINDINGS,
    )


def _finish(
    watcher: _Watcher,
    directory: Path,
    options: dict[str, Any],
    undo: Callable[[], None],
    raised: BaseException | None = None,
) -> None:
    """Compile the steady step for the target and write the estimate (or the reason there is none)."""
    from tpu_agent.chips import parse_target
    from tpu_agent.estimate.step import estimate_step, suggest_fixes
    from tpu_agent.fsutil import atomic_write_text

    undo()
    from tpu_agent.runtime.emulated import deferred, placement

    deferred.flush(
        FlushCause.ESTIMATE
    )  # the last step's pending updates: every parameter and state tensor gets its data
    watcher.refresh_roles()
    step = watcher.step_seen()
    watcher.trace_graphs(step)
    coverage = watcher.coverage(step)
    graphs = watcher.whole_graphs(step)
    result: dict[str, Any]
    try:
        if capture_only.reads.stopped is not None:
            raise capture_only.reads.stopped
        failure = script_error(raised, watcher.step, placement.DATA_DEVICE.type == "meta")
        if failure is not None:
            raise failure
        missing = coverage.missing
        if not graphs and missing:
            raise TpuAgentError(
                "xla-fallback",
                f"the step's graphs could not run through the XLA compiler, so none can be compiled for a TPU: "
                f"{missing[0]}",
                "this is a gap of the runtime's XLA path; report it with the script (tpu-agent run --compiler xla "
                "shows the same fallback)",
            )
        if not graphs:
            raise TpuAgentError(
                "nothing-captured",
                "the script ran no graph through the XLA compiler, so there is nothing to compile for a TPU",
                "make sure it moves its model and data to the 'tpu' device (tpu-agent migrate does this)",
            )
        if missing and not options.get("allow_partial"):
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise TpuAgentError(
                "partial-step",
                f"{len(missing)} graph(s) of the step could not be compiled for a TPU, {1 - coverage.share:.0%} of "
                f"its {coverage.ops} ops: {missing[0]}{more}. A verdict, time or MFU from the rest would describe "
                "part of a step, so none is given",
                "rerun with --allow-partial for figures of the compiled part, each marked with the share of the "
                "step's ops it covers; the missing graph is a gap of the XLA path: report it with the script",
                ExitCode.FINDINGS,
            )
        programs = [step_program(graph, index, watcher.role_of) for index, graph in enumerate(graphs)]
        target = parse_target(str(options["target"]))
        strategy, effort = str(options["strategy"]), str(options.get("effort", DEFAULT_EFFORT))
        estimate = estimate_step(programs, target, strategy, effort=effort)
        estimate.step_ops_share = coverage.share
        if not estimate.fits and options.get("suggest", True):
            estimate.suggestions = suggest_fixes(programs, target, strategy, current=estimate, effort=effort)
        estimate.assumptions += [
            f"captured: the graphs of optimizer step {max(watcher.step - 1, 0)} as the script ran it in one process; "
            "its batch is the global batch, split over the chips",
            "data-parallel and FSDP gradients are reduced inside the compiled programs (the compiler partitions the "
            "step as one program), not by the script's own all-reduce calls",
        ]
        chosen = watcher.bound.chosen if watcher.bound is not None else None
        if chosen:
            estimate.assumptions.append(chosen)
        if options.get("capture_only") or chosen:
            estimate.assumptions.append(
                "capture-only: the step's graphs were recorded from shapes without computing any value; host reads "
                "(loss.item(), print) saw zeros"
            )
        estimate.assumptions += capture_only.reads.assumptions
        recomputed = recompute.assumption([(graph.runner.gm, graph.calls) for graph in graphs])
        if recomputed:
            estimate.assumptions.append(recomputed)
        staged = sorted(step.staging - {str(graph.runner.name) for graph in graphs})
        if staged:
            estimate.assumptions.append(
                f"not compiled, and not needed: {', '.join(staged)}, FSDP2's gradient staging for its collectives "
                "(the compiled step partitions the parameters and reduces the gradients itself)"
            )
        if missing:
            estimate.assumptions.append(
                f"PARTIAL (--allow-partial): every figure covers {coverage.ops_compiled} of the step's {coverage.ops} "
                f"ops ({coverage.share:.0%}); the rest ran op by op and is not in the estimate"
            )
        estimate.assumptions += [f"NOT in the estimate (no XLA program): {item}" for item in missing]
        result = {
            "ok": True,
            "estimate": estimate.to_dict(),
            "steps_watched": watcher.step,
            "capture_only_chosen": chosen,
        }
    except TpuAgentError as error:
        result = {"ok": False, "error": {**error.to_dict(), "exit_code": int(error.exit_code)}}
    atomic_write_text(directory / RESULT_FILE, json.dumps(result, indent=2))


def install() -> Callable[[], None] | None:
    """Runtime hook (``TPU_AGENT_HOOKS``): start watching; the returned finalizer compiles and writes."""
    directory_text = os.environ.get(ESTIMATE_DIR_ENV)
    if not directory_text:
        return None
    directory = Path(directory_text)
    options = _read_options(directory)
    from torch.nn.modules import module as module_hooks
    from torch.optim import optimizer as optimizer_module

    from tpu_agent.runtime.emulated import deferred
    from tpu_agent.runtime.xla import graphs

    bound = host_bound.HostBound(
        int(options.get("host_memory_bytes") or host_bound.default_bound_bytes()), capture_only.install
    )
    if options.get("capture_only"):
        capture_only.install()
    else:  # the bound's hook first: the capture-only one after it swaps the parameter that crossed the bound
        module_hooks.register_module_parameter_registration_hook(bound.parameter_registered)
        deferred.flush_observers.append(bound.flushed)
    module_hooks.register_module_parameter_registration_hook(capture_only.swap_parameter)
    steps = int(options.get("steps", DEFAULT_OPTIMIZER_STEPS))
    watcher = _Watcher(steps=max(MIN_OPTIMIZER_STEPS, steps), bound=bound)
    graphs.graph_observers.append(watcher.observe)
    graphs.fallback_observers.append(watcher.fell_back)
    deferred.flush_observers.append(watcher.flushed)
    step_hook = optimizer_module.register_optimizer_step_post_hook(watcher.end_step)
    undo_recompute = recompute.install()

    def undo() -> None:
        step_hook.remove()
        undo_recompute()
        if watcher.flushed in deferred.flush_observers:
            deferred.flush_observers.remove(watcher.flushed)
        if watcher.observe in graphs.graph_observers:
            graphs.graph_observers.remove(watcher.observe)
        if watcher.fell_back in graphs.fallback_observers:
            graphs.fallback_observers.remove(watcher.fell_back)

    def finalize() -> None:
        raised = sys.exc_info()[1]  # the script's own exception: finalizers run while the runtime handles it
        try:
            _finish(watcher, directory, options, undo, raised)
        except Exception as error:  # noqa: BLE001 - reported to the parent, never a traceback in the script's output
            from tpu_agent.fsutil import atomic_write_text

            message = f"{type(error).__name__}: {error}"
            hint = "rerun with --format json and report it with the script that produced it"
            result = {"ok": False, "error": {"code": "estimate-failed", "message": message, "hint": hint}}
            atomic_write_text(directory / RESULT_FILE, json.dumps(result))
            print(f"tpu-agent estimate: {type(error).__name__}: {error}", file=sys.stderr)

    return finalize
