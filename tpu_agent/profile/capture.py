"""Capture: run a script under the runtime with profiling on, and the in-process hook that records it.

Two halves:

* :func:`run_capture` (parent process) launches the target through :func:`tpu_agent.runtime.api.launch`
  with ``TPU_AGENT_EVENTS_DIR`` (the runtime event log) and ``TPU_AGENT_HOOKS`` naming :func:`install`.
* :func:`install` (every rank, before user code) starts ``torch.profiler`` on a wait/warmup/active schedule,
  marks steps (optimizer step, else the user's ``with tpu_agent.profile.step():``), times DataLoader waits,
  records DataLoader settings, the weights of the modules that ran and the memory they hold, and, when the
  emulated device is not handling them (plain CPU tensors), host syncs and Dynamo graph breaks/recompiles.
  When the window ends it writes ``rank<R>.pt.trace.json`` (the profiler's Chrome trace, which Perfetto and
  chrome://tracing also open), and at exit ``capture-rank<R>.json``, next to the event log.

Everything written goes to the raw directory ``<logdir>/tpu-agent/raw``; :mod:`tpu_agent.profile.load`
reads it back into the :class:`~tpu_agent.profile.model.ProfileModel`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import linecache
import logging
import os
import re
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tpu_agent.fsutil import atomic_write_with
from tpu_agent.runtime import events as ev

PROFILE_DIR_ENV = "TPU_AGENT_PROFILE_DIR"
PROFILE_STEPS_ENV = "TPU_AGENT_PROFILE_STEPS"
PROFILE_WARMUP_ENV = "TPU_AGENT_PROFILE_WARMUP"
HOOK_SPEC = "tpu_agent.profile.capture:install"
TRACE_FILE = "rank{rank}.pt.trace.json"
CAPTURE_FILE = "capture-rank{rank}.json"

_SYNC_METHODS = {
    "item": "item",
    "tolist": "tolist",
    "numpy": "numpy",
    "cpu": "cpu",
    "__bool__": "bool",
    "__float__": "float",
    "__int__": "int",
    "__repr__": "print",
    "__format__": "print",
}
_GRAPH_BREAK_RE = re.compile(r"Graph break.*? in user code at (?P<file>.+?):(?P<line>\d+)\s*\nGraph Break Reason: (?P<reason>.*)")
_RECOMPILE_RE = re.compile(r"Recompiling function (?P<func>\S+) in (?P<file>.+?):(?P<line>\d+)\s+triggered by.*?- (?P<reason>[^\n]+)", re.S)
_ASSIGN_CACHE: dict[type, dict[str, int]] = {}
_active: _Capture | None = None


def _direct_caller_is_user(depth: int) -> bool:
    """True when the frame ``depth`` levels up is user code (not torch, not us, not the stdlib)."""
    frame = sys._getframe(depth + 1)
    return not ev._is_library_file(frame.f_code.co_filename)


def _attribute_lines(cls: type) -> dict[str, int]:
    """``self.<name> = ...`` assignment lines in a module class's source, to name where a layer is built."""
    if cls not in _ASSIGN_CACHE:
        lines: dict[str, int] = {}
        try:
            source, start = inspect.getsourcelines(cls)
        except (OSError, TypeError):
            source, start = [], 0
        for offset, text in enumerate(source):
            match = re.match(r"\s*self\.(\w+)\s*(?::[^=]+)?=", text)
            if match and match.group(1) not in lines:
                lines[match.group(1)] = start + offset
        _ASSIGN_CACHE[cls] = lines
    return _ASSIGN_CACHE[cls]


def _weight_site(parent: Any, attr: str) -> ev.Site | None:
    cls = type(parent)
    line = _attribute_lines(cls).get(attr)
    if line is None:
        return None
    try:
        filename = inspect.getsourcefile(cls) or ""
    except TypeError:
        return None
    if ev._is_library_file(filename):
        return None
    return ev.Site(file=filename, line=line, function=f"{cls.__name__}.__init__")


def _tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class _Capture:
    """Per-process recorder; one instance, created by :func:`install`."""

    def __init__(self, out_dir: Path, steps: int, warmup: int) -> None:
        import torch

        self.torch = torch
        self.out_dir = out_dir
        self.rank = int(os.environ.get("RANK", "0"))
        self.steps = steps
        self.warmup = warmup
        self.log = ev.get_log()
        self.step = 0
        self.step_source: str | None = None
        self.step_started = False
        self.step_site: ev.Site | None = None
        self.forward_site: ev.Site | None = None
        self.roots: dict[int, Any] = {}
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.dataloaders: list[dict[str, Any]] = []
        self.data_waits: list[dict[str, Any]] = []
        self.memory: dict[str, int] | None = None
        self.weights: list[dict[str, Any]] = []
        self.module_types: list[str] = []
        self.depth = 0
        self.restore: list[Callable[[], None]] = []
        self.module_hooks: list[Any] = []
        # The emulated device marks optimizer steps itself (and counts torch.profiler steps as user steps), so
        # this recorder then only follows the step count; elsewhere it writes the markers.
        emulation = sys.modules.get("tpu_agent.runtime.emulated")
        self.emulated = bool(emulation is not None and emulation.is_active())
        self.window = (warmup, warmup + steps - 1)
        self.prof: Any = None
        self.profiler_tried = False
        self.warnings: list[str] = []
        self._advance_profiler()

    # -- torch.profiler ---------------------------------------------------------------------------
    def _advance_profiler(self) -> None:
        """Start as the first measured step begins (Kineto's start-up costs under a millisecond, and a step
        recorded before the window would only add op records to stop, convert and analyse); stop after it.

        ``profile.step()`` is not used: the runtime treats it as the user's own step marker.
        """
        first, last = self.window
        if self.prof is None and not self.profiler_tried and self.step >= first:
            from torch.autograd import profiler as autograd_profiler
            from torch.profiler import ProfilerActivity, profile

            self.profiler_tried = True  # one attempt: on failure the window stays without an op trace
            if autograd_profiler._is_profiler_enabled:
                self.warnings.append("the script runs its own torch.profiler: no op trace was recorded")
                return
            # Shapes, not allocations: profile_memory would cost ~25 % more per op; memory comes from the
            # runtime's per-step samples and from the model state measured directly.
            prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
            try:
                prof.start()
            except RuntimeError as error:
                self.warnings.append(f"torch.profiler could not start: {error}")
                return
            self.prof = prof
        elif self.prof is not None and self.step > last:
            self._stop_profiler()

    def _stop_profiler(self) -> None:
        prof, self.prof = self.prof, None
        if prof is None:
            return
        prof.stop()
        # torch writes the Chrome trace in C++ (a fraction of what converting its records in Python costs, in
        # the middle of the user's run); the parent parses it while the script goes on. Atomic, because the
        # parent reads the file as soon as it appears.
        results = prof.profiler.kineto_results
        atomic_write_with(self.out_dir / TRACE_FILE.format(rank=self.rank), results.save)

    # -- steps ------------------------------------------------------------------------------------
    def _marks(self, source: str) -> bool:
        return not (self.emulated and source == "optimizer")

    def begin_step(self, source: str) -> None:
        if self.step_source not in (None, source) or self.step_started:
            return
        self.step_started = True
        if self._marks(source):
            self.log.step = self.step
            ev.emit(ev.StepMarker, phase="begin", source=source)

    def end_step(self, source: str, site: ev.Site | None) -> None:
        if self.step_source is None:
            self.step_source = source
        if self.step_source != source:
            return
        if not self.step_started:
            self.begin_step(source)
        self.step_site = self.step_site or site
        if self._marks(source):
            ev.emit(ev.StepMarker, phase="end", source=source)
            self.log.step = self.step + 1
        if self.step == 0:
            self._finish_module_discovery()
        if self.step <= 1:
            self._measure_state()
        self.step += 1
        self.step_started = False
        self._advance_profiler()
        if source == "optimizer":
            self.begin_step(source)

    def _first_activity(self) -> None:
        if self.step == 0 and not self.step_started and self.step_source in (None, "optimizer"):
            self.begin_step("optimizer")

    # -- modules ----------------------------------------------------------------------------------
    def _install_module_hooks(self) -> None:
        from torch.nn.modules import module as module_mod

        def pre(module: Any, args: Any) -> None:
            if self.torch.compiler.is_compiling():
                return
            if self.depth == 0:
                self._first_activity()
                self.roots.setdefault(id(module), module)
                self.forward_site = self.forward_site or _statement_site()
            self.depth += 1

        def post(module: Any, args: Any, output: Any) -> None:
            if self.torch.compiler.is_compiling():
                return
            self.depth = max(self.depth - 1, 0)

        self.module_hooks = [
            module_mod.register_module_forward_pre_hook(pre),
            module_mod.register_module_forward_hook(post, always_call=True),
        ]

    def _finish_module_discovery(self) -> None:
        for handle in self.module_hooks:
            handle.remove()
        self.module_hooks = []
        seen: set[int] = set()
        for root in self.roots.values():
            self.module_types.append(type(root).__name__)
            for qualname, module in root.named_modules():
                weight = getattr(module, "weight", None)
                if not isinstance(weight, self.torch.Tensor) or weight.dim() < 2 or id(weight) in seen:
                    continue
                seen.add(id(weight))
                parent_name, _, attr = qualname.rpartition(".")
                parent = root.get_submodule(parent_name) if qualname else None
                site = _weight_site(parent, attr) if parent is not None else None
                self.weights.append(
                    {
                        "module": qualname or type(root).__name__,
                        "module_type": type(module).__name__,
                        "shape": list(weight.shape),
                        "dtype": str(weight.dtype).removeprefix("torch."),
                        "site": asdict(site) if site else None,
                    }
                )

    def _measure_state(self) -> None:
        params: dict[int, Any] = {}
        for root in self.roots.values():
            params.update((id(p), p) for p in root.parameters())
        optimizer_tensors: dict[int, Any] = {}
        for optimizer in list(self.optimizers):
            for group in optimizer.param_groups:
                params.update((id(p), p) for p in group["params"])
            for state in optimizer.state.values():
                optimizer_tensors.update((id(v), v) for v in state.values() if isinstance(v, self.torch.Tensor) and v.dim() > 0)
        self.memory = {
            "param_bytes": _tensor_bytes(params.values()),
            "grad_bytes": _tensor_bytes(p.grad for p in params.values() if p.grad is not None),
            "optimizer_bytes": _tensor_bytes(optimizer_tensors.values()),
        }

    # -- patches ----------------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self.restore.append(lambda: setattr(owner, name, original))

    def _install_patches(self) -> None:
        from torch.utils.data import dataloader as dl

        def optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.optimizers.add(optimizer)
            self.end_step("optimizer", ev.user_call_site(2))

        from torch.optim import optimizer as optimizer_mod

        handle = optimizer_mod.register_optimizer_step_post_hook(optimizer_post_hook)
        self.restore.append(handle.remove)

        def wrap_next(original: Callable[..., Any]) -> Callable[..., Any]:
            def __next__(it: Any) -> Any:
                self._first_activity()
                start = time.time_ns()
                try:
                    return original(it)
                finally:
                    if self.step <= self.window[1]:  # only the steps the analysis reads, however long the run
                        self.data_waits.append(
                            {
                                "step": self.log.step,
                                "duration_ns": time.time_ns() - start,
                                "time_ns": start,
                                "site": _site_dict(ev.user_call_site(2)),
                            }
                        )

            return __next__

        self._patch(dl._BaseDataLoaderIter, "__next__", wrap_next)

        def wrap_init(original: Callable[..., Any]) -> Callable[..., Any]:
            def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
                original(loader, *args, **kwargs)
                try:
                    dataset_len = len(loader.dataset)
                except TypeError:
                    dataset_len = None
                self.dataloaders.append(
                    {
                        "batch_size": loader.batch_size,
                        "num_workers": loader.num_workers,
                        "drop_last": bool(loader.drop_last),
                        "dataset_len": dataset_len,
                        "site": _site_dict(ev.user_call_site(2)),
                    }
                )

            return __init__

        self._patch(dl.DataLoader, "__init__", wrap_init)
        if not self.emulated:  # the emulated device reports its own host syncs and compiles
            self._patch_host_syncs()
        self._listen_to_dynamo()

    def _patch_host_syncs(self) -> None:
        """Record device-to-host reads the user's own lines make (the emulated device does this for ``tpu``)."""
        torch = self.torch
        for method, op in _SYNC_METHODS.items():

            def make(original: Callable[..., Any], op: str = op) -> Callable[..., Any]:
                def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
                    if not torch.compiler.is_compiling() and self.log.step is not None and _direct_caller_is_user(1):
                        site = ev.user_call_site(2)
                        ev.emit(ev.HostSync, op=op, site=site)
                    return original(tensor, *args, **kwargs)

                wrapper.__name__ = original.__name__
                return wrapper

            self._patch(torch.Tensor, method, make)

    def _listen_to_dynamo(self) -> None:
        """Turn Dynamo's graph-break and recompile logs into runtime events with their user lines.

        Graph breaks are always recorded (Dynamo's message carries the explanation the rules quote);
        recompiles only where the emulated device does not already log them as Compile records.
        """
        capture = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                capture._on_dynamo_log(record.getMessage())

        loggers = ["torch._dynamo.symbolic_convert.__graph_breaks"]
        if not self.emulated:
            loggers.append("torch._dynamo.guards.__recompiles")
            with contextlib.suppress(AttributeError, ImportError):
                from torch._logging import _internal

                _internal.log_state.enable_artifact("recompiles")
        for name in loggers:
            logger = logging.getLogger(name)
            logger.handlers = [_Handler()]
            logger.propagate = False
            logger.setLevel(logging.DEBUG)

    def _on_dynamo_log(self, message: str) -> None:
        match = _GRAPH_BREAK_RE.search(message)
        if match:
            site = ev.Site(match["file"], int(match["line"]), _function_at(match["file"], int(match["line"])))
            reason = _graph_break_reason(message) or match["reason"].strip()
            ev.emit(ev.GraphBreak, reason=reason, site=site)
            return
        match = _RECOMPILE_RE.search(message)
        if match:
            site = ev.Site(match["file"], int(match["line"]), match["func"])
            ev.emit(
                ev.Compile,
                function=match["func"],
                graph_id=-1,
                graph_ops=0,
                is_recompile=True,
                reason=match["reason"].strip().split(": ", 1)[-1],
                duration_ns=0,
                site=site,
            )

    # -- exit -------------------------------------------------------------------------------------
    def finish(self) -> None:
        for undo in reversed(self.restore):
            undo()
        if self.step == 0:
            self._finish_module_discovery()
            self._measure_state()
        self._stop_profiler()
        record = {
            "rank": self.rank,
            "host": os.uname().nodename,
            "steps_completed": self.step,
            "step_source": self.step_source,
            "window": list(self.window),
            "step_site": _site_dict(self.step_site),
            "forward_site": _site_dict(self.forward_site),
            "module_types": self.module_types,
            "weights": self.weights,
            "memory": self.memory,
            "dataloaders": self.dataloaders,
            "data_waits": self.data_waits,
            "warnings": self.warnings,
        }
        (self.out_dir / CAPTURE_FILE.format(rank=self.rank)).write_text(json.dumps(record), encoding="utf-8")
        self.log.flush()


def _statement_site() -> ev.Site | None:
    """The innermost user frame whose current line is a statement.

    A compiled function's frame reports its decorator or ``def`` line while Dynamo runs it; the useful line
    is then its caller's.
    """
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not ev._is_library_file(filename):
            text = linecache.getline(filename, frame.f_lineno).strip()
            if not text.startswith(("@", "def ", "async def ")):
                return ev.Site(file=filename, line=frame.f_lineno, function=frame.f_code.co_name)
        frame = frame.f_back
    return None


def _site_dict(site: ev.Site | None) -> dict[str, Any] | None:
    return asdict(site) if site else None


def _function_at(filename: str, line: int) -> str:
    """The name of the innermost ``def`` enclosing ``line`` (Dynamo's message names only file:line)."""
    try:
        lines = Path(filename).read_text(encoding="utf-8").splitlines()[:line]
    except OSError:
        return "<unknown>"
    for text in reversed(lines):
        match = re.match(r"\s*(?:async\s+)?def\s+(\w+)", text)
        if match:
            return match.group(1)
    return "<module>"


def _graph_break_reason(message: str) -> str | None:
    match = re.search(r"Explanation: (.+)", message)
    return match.group(1).strip() if match else None


def install() -> Callable[[], None] | None:
    """``TPU_AGENT_HOOKS`` entry point: start recording in this process; returns the at-exit finisher."""
    global _active
    directory = os.environ.get(PROFILE_DIR_ENV)
    if not directory or _active is not None:
        return None
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    capture = _Capture(out_dir, steps=int(os.environ.get(PROFILE_STEPS_ENV, "10")), warmup=int(os.environ.get(PROFILE_WARMUP_ENV, "2")))
    capture._install_patches()
    capture._install_module_hooks()
    _active = capture
    return capture.finish


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one step for scripts without an optimizer: ``with tpu_agent.profile.step(): ...``.

    Outside ``tpu-agent profile`` this does nothing, so the annotation can stay in the code.
    """
    capture = _active
    if capture is not None:
        capture.begin_step("annotation")
    try:
        yield
    finally:
        if capture is not None:
            capture.end_step("annotation", ev.user_call_site(3))
