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
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tpu_agent.estimate import capture_only
from tpu_agent.estimate.capture_only import storage_identity
from tpu_agent.estimate.layout import ESTIMATE_DIR_ENV, OPTIONS_FILE, RESULT_FILE
from tpu_agent.estimate.model import ArgRole, ArgSpec, StepProgram

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
class _Watcher:
    """State of one capture: storage roles, graphs per step, the step count."""

    steps: int
    roles: dict[int, ArgRole] = field(default_factory=dict)
    current: dict[tuple[str, object], ObservedGraph] = field(default_factory=dict)
    steady: dict[tuple[str, object], ObservedGraph] = field(default_factory=dict)
    # graphs that ran on the CPU path instead (a graph that failed once is not tried again, so: the whole run)
    fallbacks: dict[str, str] = field(default_factory=dict)
    step: int = 0

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
        seen = self.current.get(key)
        if seen is not None:
            seen.calls += 1
            return
        # roles are resolved at the end: while a step is in flight, DeferAndFuse leaves tensors written in place
        # without data, so only their storages (stable across in-place updates) are recorded here
        described = [
            (tuple(t.shape), t.dtype, storage_identity(t)) if isinstance(t, torch.Tensor) else float(t) for t in inputs
        ]
        self.current[key] = ObservedGraph(runner, precision, described)

    def end_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.step += 1
        if self.step >= 2:  # step 0 builds optimizer state and compiles: never the steady step
            self.steady = self.current
        self.current = {}
        if self.step >= self.steps:
            raise CaptureComplete()

    def fell_back(self, graph_name: str, description: str, error: BaseException) -> None:
        """A graph ran on the CPU path after all: its pieces that did run through XLA are not a program of the
        step (the whole graph ran again on the CPU), so they are dropped and the graph is named instead."""
        self.current = {
            key: seen for key, seen in self.current.items() if not str(seen.runner.name).startswith(graph_name)
        }
        self.fallbacks.setdefault(graph_name, f"{description}: {type(error).__name__}: {str(error)[:200]}")

    def graphs(self) -> list[ObservedGraph]:
        """The steady step's graphs; without two optimizer steps (inference, short scripts), all graphs seen."""
        return list((self.steady or self.current).values())


def step_program(graph: ObservedGraph, index: int, role_of: Callable[[int | None], ArgRole]) -> StepProgram:
    """A captured graph as a :class:`StepProgram`: the same JAX function the XLA executor runs, traced again
    on shapes only. Python floats the graph reads (learning rate, betas) are fixed at their observed values."""
    import jax

    from tpu_agent.runtime.xla import lowering

    examples: list[torch.Tensor | float] = [
        torch.empty(item[0], dtype=item[1], device="meta") if isinstance(item, tuple) else item for item in graph.inputs
    ]
    traced = lowering.trace_graph(graph.runner.gm, examples, graph.precision)
    seed = traced.abstract[0]
    args = [ArgSpec("rng_seed", tuple(seed.shape), str(seed.dtype), ArgRole.OTHER)]
    positions: list[int] = []
    for position, (item, abstract) in enumerate(zip(graph.inputs, traced.abstract[1:], strict=True)):
        if isinstance(item, tuple):
            args.append(ArgSpec(f"input{position}", tuple(abstract.shape), str(abstract.dtype), role_of(item[2])))
            positions.append(position)
    floats = {position: item for position, item in enumerate(graph.inputs) if not isinstance(item, tuple)}
    count = len(graph.inputs)

    def program(rng_seed: jax.Array, *arrays: jax.Array) -> Any:
        merged: list[Any] = [None] * count
        for position, array in zip(positions, arrays, strict=True):
            merged[position] = array
        for position, value in floats.items():
            merged[position] = value
        return traced.function(rng_seed, *merged)

    donated = tuple(i for i, arg in enumerate(args) if arg.role in _DONATED_ROLES)
    return StepProgram(f"{index}: {graph.runner.name}", program, tuple(args), donated, graph.calls)


def _read_options(directory: Path) -> dict[str, Any]:
    options = json.loads((directory / OPTIONS_FILE).read_text())
    if not isinstance(options, dict):
        raise ValueError(f"{directory / OPTIONS_FILE} is not an object")
    return options


def _finish(watcher: _Watcher, directory: Path, options: dict[str, Any], undo: Callable[[], None]) -> None:
    """Compile the steady step for the target and write the estimate (or the reason there is none)."""
    from tpu_agent.chips import parse_target
    from tpu_agent.errors import TpuAgentError
    from tpu_agent.estimate.step import estimate_step, suggest_fixes
    from tpu_agent.fsutil import atomic_write_text

    undo()
    from tpu_agent.runtime.emulated import deferred

    deferred.flush("estimate")  # the last step's pending updates: every parameter and state tensor gets its data
    watcher.refresh_roles()
    graphs = watcher.graphs()
    result: dict[str, Any]
    try:
        if capture_only.reads.stopped is not None:
            raise capture_only.reads.stopped
        missing = list(watcher.fallbacks.values())
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
        programs = [step_program(graph, index, watcher.role_of) for index, graph in enumerate(graphs)]
        target = parse_target(str(options["target"]))
        strategy = str(options["strategy"])
        estimate = estimate_step(programs, target, strategy)
        if not estimate.fits and options.get("suggest", True):
            estimate.suggestions = suggest_fixes(programs, target, strategy)
        estimate.assumptions += [
            f"captured: the graphs of optimizer step {max(watcher.step - 1, 0)} as the script ran it in one process; "
            "its batch is the global batch, split over the chips",
            "data-parallel and FSDP gradients are reduced inside the compiled programs (the compiler partitions the "
            "step as one program), not by the script's own all-reduce calls",
            "graphs the XLA lowering cannot take are not in the estimate (each is named below)",
        ]
        if options.get("capture_only"):
            estimate.assumptions.append(
                "capture-only: the step's graphs were recorded from shapes without computing any value; host reads "
                "(loss.item(), print) saw zeros"
            )
        estimate.assumptions += [f"NOT in the estimate (no XLA program): {item}" for item in missing]
        result = {"ok": True, "estimate": estimate.to_dict(), "steps_watched": watcher.step}
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
    from torch.optim import optimizer as optimizer_module

    from tpu_agent.runtime.xla import graphs

    if options.get("capture_only"):
        capture_only.install()
    watcher = _Watcher(steps=max(2, int(options.get("steps", 3))))
    graphs.graph_observers.append(watcher.observe)
    graphs.fallback_observers.append(watcher.fell_back)
    step_hook = optimizer_module.register_optimizer_step_post_hook(watcher.end_step)

    def undo() -> None:
        step_hook.remove()
        if watcher.observe in graphs.graph_observers:
            graphs.graph_observers.remove(watcher.observe)
        if watcher.fell_back in graphs.fallback_observers:
            graphs.fallback_observers.remove(watcher.fell_back)

    def finalize() -> None:
        try:
            _finish(watcher, directory, options, undo)
        except Exception as error:  # noqa: BLE001 - reported to the parent, never a traceback in the script's output
            from tpu_agent.fsutil import atomic_write_text

            message = f"{type(error).__name__}: {error}"
            hint = "rerun with --format json and report it with the script that produced it"
            result = {"ok": False, "error": {"code": "estimate-failed", "message": message, "hint": hint}}
            atomic_write_text(directory / RESULT_FILE, json.dumps(result))
            print(f"tpu-agent estimate: {type(error).__name__}: {error}", file=sys.stderr)

    return finalize
