"""Running an ATen FX graph on CPU tensors through XLA, split around ops that have no lowering.

:class:`GraphRunner` is what both front ends hand their graphs to: the ``"tpu"`` Dynamo backend (one runner
per AOTAutograd forward and backward graph) and the DeferAndFuse XLA executor (one per captured graph). A
runner looks up the executable for the call's input shapes, dtypes and matmul precision in the shared
:data:`cache.executables` and compiles on a miss.

An op torchax cannot lower never crashes a run and never silently changes a result: the graph is split into
runs of lowerable ops, each compiled by XLA, and the ops between them run on the CPU exactly as Strict mode
runs them (same MXU rounding). Each such op is reported once as a
:class:`~tpu_agent.runtime.events.FallbackOp` naming the op and the user's line that produced it.
"""

from __future__ import annotations

import hashlib
import operator
import re
import sys
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.split_module import split_module

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import kernels, state
from tpu_agent.runtime.xla import cache, fx_names, lowering, op_records

fx_names.install()  # the split graphs' code names keyword ops (aten.random.from) validly

# Called with (runner, inputs, precision) after each XLA run of a graph: how ``tpu-agent estimate`` sees the
# graphs of a step and the tensors they read. Empty unless an observer installed itself.
graph_observers: list[Callable[[GraphRunner, Sequence[torch.Tensor | float], state.Precision], None]] = []

# Called with (runner name, op count, error) when a captured graph could not run through XLA and ran on the CPU
# path instead: ``tpu-agent estimate`` says which part of the step its compiled programs leave out.
fallback_observers: list[Callable[[str, int, BaseException], None]] = []


# reasons already told on stderr: a user asked for XLA and is told once per cause that a graph did not get it
_told: set[str] = set()


def report_fallback(name: str, op_count: int, error: BaseException, site: events.Site | None) -> None:
    """Tell the observers, the event log and (once per reason) stderr that graph ``name`` runs op by op instead
    of through XLA, and why: a run that asked for the compiler must not silently run without it."""
    for observe in fallback_observers:
        observe(name, op_count, error)
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
    if reason not in _told:
        _told.add(reason)
        where = f" (recorded at {site.file}:{site.line})" if site is not None else ""
        print(
            f"tpu-agent: --compiler xla: {name} ({op_count} ops){where} runs op by op on the CPU, not through XLA: "
            f"{reason}",
            file=sys.stderr,
        )
    if state.log_enabled:
        events.emit(events.FallbackOp, op=f"{name} ({type(error).__name__}: {error})"[:300], site=site)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def user_site(node: torch.fx.Node) -> events.Site | None:
    """The user line a graph node came from, read from the stack trace Dynamo keeps in its metadata."""
    trace = node.meta.get("stack_trace") or ""
    frames = [f for f in _FRAME.findall(trace) if not events.is_library_file(f[0])]
    if not frames:
        return None
    file, line, function = frames[-1]
    return events.Site(file, int(line), function)


def graph_signature(gm: torch.fx.GraphModule) -> str:
    """Stable over identical graphs (the code and any constant tensors baked into it), whatever object holds them."""
    digest = hashlib.sha1(gm.code.encode())
    # AOTAutograd hands graphs over inside its fake mode; a constant (``torch.as_tensor(511, device=x.device)``
    # folded by Dynamo) is real data, read outside it
    with unset_fake_temporarily():
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(gm, node.target, None)
                if isinstance(value, torch.Tensor):
                    digest.update(f"{node.target}{tuple(value.shape)}{value.dtype}".encode())
                    digest.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:20]


def op_count(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function")


class EagerOps(torch.fx.Interpreter):
    """Runs a graph op by op on the CPU with the eager emulation's op semantics (MXU operand rounding at
    ``precision``, or the thread's)."""

    def __init__(self, gm: torch.fx.GraphModule, precision: state.Precision | None = None) -> None:
        super().__init__(gm)
        self.precision = precision

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if isinstance(target, torch._ops.OpOverload):
            precision = self.precision if self.precision is not None else state.effective_precision()
            return kernels.run_on_cpu(target, list(args), dict(kwargs), precision)
        return super().call_function(target, args, kwargs)


def _specialisation(args: Sequence[Any]) -> tuple[Any, ...] | None:
    """What an executable is compiled for: each argument's shape and dtype (a float's type), read in one pass;
    None when an argument is neither a tensor nor a float (a symbolic size): such a graph runs op by op.

    Every torch.compile call pays this for each of its (often a hundred) arguments, so the shape stays the
    ``torch.Size`` the tensor returns: it hashes and compares as the tuple it is, without a copy."""
    spec: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            spec.append((a.shape, a.dtype))
        elif isinstance(a, float):
            spec.append(float)
        else:
            return None
    return tuple(spec)


class _Segment(torch.nn.Module):
    """A split-out piece of the graph, as the module ``split_module`` calls."""

    def __init__(self, runner: Any) -> None:
        super().__init__()
        self.runner = runner

    def forward(self, *args: Any) -> Any:
        return self.runner(*args)


class GraphRunner:
    """An ATen graph run through XLA executables (compiled per input specialisation, cached)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        site: events.Site | None = None,
        precision: state.Precision | None = None,
    ) -> None:
        self.gm = gm
        self.name = name
        self.site = site
        # the matmul precision the lowering rounds at; None: the thread's at each call (torch.compile graphs).
        # DeferAndFuse graphs have each op's recorded rounding traced in already: HIGHEST adds none.
        self.precision = precision
        self.signature = graph_signature(gm)
        self.split: torch.fx.GraphModule | None = None
        self.compile_failed = False  # the graph did not lower after all: it runs op by op from then on
        # per specialisation, the graph's ops as a profiler records them (built at the first profiled run)
        self.recorded_ops: dict[Hashable, list[op_records.OpRecord]] = {}
        missing = lowering.unsupported_ops(gm)
        if missing:
            self.split = self._split(missing)

    def _split(self, missing: list[torch.fx.Node]) -> torch.fx.GraphModule:
        unsupported = set(missing)
        for node in missing:
            if state.log_enabled:
                events.emit(events.FallbackOp, op=str(node.target), site=user_site(node) or self.site)
        partition_id, previous_eager = 0, None
        assignment: dict[torch.fx.Node, int] = {}
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            source = node.args[0] if node.target is operator.getitem and node.args else None
            if source in unsupported:  # an eager op's segment returns its tensors, not the tuple holding them: a
                assignment[node] = assignment[source]  # tuple argument would run the next segment op by op
                continue
            eager = node in unsupported
            if previous_eager is not None and (eager or previous_eager):
                partition_id += 1
            previous_eager = eager
            assignment[node] = partition_id
        split = split_module(self.gm, None, lambda node: assignment[node], keep_original_order=True)
        eager_ids = {assignment[n] for n in missing}
        for name, sub in list(split.named_children()):
            index = int(name.removeprefix("submod_"))
            if index in eager_ids:
                runner: Any = EagerOps(sub, self.precision).run
            else:
                runner = GraphRunner(sub, f"{self.name}#{index}", self.site, self.precision)
            setattr(split, name, _Segment(runner))
        return split

    def __call__(self, *args: Any, specialisation: Hashable | None = None) -> Any:
        """Run the graph on ``args``. A caller that knows what the arguments' shapes and dtypes are (one runner
        per planned DeferAndFuse graph) passes ``specialisation`` naming them, instead of having them read from
        a few hundred arguments at every call."""
        if self.split is not None:
            return self.split(*args)
        if specialisation is None:
            specialisation = _specialisation(args)
        elif not all(isinstance(a, (torch.Tensor, float)) for a in args):
            specialisation = None
        if self.compile_failed or specialisation is None:
            return EagerOps(self.gm, self.precision).run(*args)
        tensors: Sequence[torch.Tensor | float] = args
        precision = self.precision if self.precision is not None else state.effective_precision()
        specialisation = (specialisation, precision.name, state.allow_excess_precision)  # a change recompiles
        try:
            executable = cache.executables.get_or_compile(
                self.signature,
                specialisation,
                lambda: lowering.compile_graph(self.gm, tensors, precision),
                self.name,
                self.site,
                lambda: op_count(self.gm),
            )
        except Exception as error:  # noqa: BLE001 - a lowering that fails to trace: op by op, never a crash
            self.compile_failed = True
            report_fallback(self.name, op_count(self.gm), error, self.site)
            return EagerOps(self.gm, self.precision).run(*args)
        profiling = op_records.profiling()
        if (profiling or state.log_enabled) and specialisation not in self.recorded_ops:
            # in a profile's process, built at the specialisation's first run (its compile, in the warm-up), not
            # in the first measured step, whose time it would inflate
            self.recorded_ops[specialisation] = op_records.op_records(self.gm, tensors)
        if profiling:
            result = op_records.run_recorded(self.name, lambda: executable(tensors), self.recorded_ops[specialisation])
        else:
            result = executable(tensors)
        for observe in graph_observers:
            observe(self, tensors, precision)
        return result
