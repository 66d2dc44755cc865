"""``torch.compile(backend="tpu")`` on the emulated device, with TorchTPU's rules (reference §3).

* The Dynamo backend ``"tpu"`` is registered; today its graphs run eagerly on the emulated device (in Strict
  mode, after flushing pending deferred work: compiled outputs come back materialised). A later issue lowers
  the same FX graphs through XLA.
* ``torch.compile`` is wrapped as TorchTPU wraps it: no ``backend=`` means "tpu" when an input is a tpu
  tensor (otherwise the usual CPU default); TPU backends get ``dynamic=False`` unless told otherwise;
  ``dynamic=True``, ``mode=`` and unknown options are refused with TorchTPU's messages; ``backend="inductor"``
  with tpu inputs is refused, and so is a graph traced under ``torch.inference_mode`` (``torch.no_grad()`` is the way).
* Every compile and recompile (with the guard that failed) and every graph break goes to the event log.

Dynamo is imported on the first ``torch.compile`` call, so activating the device stays cheap.
"""

from __future__ import annotations

import functools
import itertools
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tpu_agent.runtime import events
from tpu_agent.runtime.compile_options import OPTION_KEYS
from tpu_agent.runtime.emulated import compile_cache, state
from tpu_agent.runtime.emulated.flush_cause import FlushCause

# TorchTPU's backend raises NotImplementedError with this text for dynamic=True (reference §3.3); we mirror it.
DYNAMIC_MESSAGE = (
    "TPU backend does not support torch.compile(..., dynamic=True, ...). Please run torch.compile() with "
    "dynamic=None or default dynamism (dynamic=False is applied automatically for the tpu backend)."
)
INDUCTOR_MESSAGE = (
    "torch.compile(..., backend='inductor') on TPU is experimental and does not yet have full TPU support. "
    "Pass backend='tpu' or do not specify `backend` to use the TPU backend. To bypass this check, pass "
    "options={'tpu_backend': 'pallas'}."
)


# TorchTPU's error glossary: inference_mode inside a compiled function is not supported on TPU (it leaves the
# dispatcher's state corrupt); torch.no_grad() gives the same inference without autograd.
INFERENCE_MODE_MESSAGE = (
    "torch.inference_mode() is not supported in or around a function compiled with torch.compile(backend='tpu'): "
    "use torch.no_grad() instead (decorate the function with @torch.no_grad() or wrap the call in "
    "`with torch.no_grad():`)."
)


def _unexpected(kwargs: dict[str, Any]) -> TypeError:
    return TypeError(f"Unexpected keyword arguments: {kwargs}")


def validate_options(options: dict[str, Any] | None) -> None:
    """TorchTPU's backend takes only its own option keys (reference §3.2)."""
    if not options:
        return
    unknown = {k: v for k, v in options.items() if k not in OPTION_KEYS}
    if unknown:
        raise _unexpected(unknown)
    buckets = options.get("num_dynamic_buckets", 1)
    if not isinstance(buckets, int) or not 1 <= buckets <= 8:
        raise ValueError(f"num_dynamic_buckets must be an integer in 1..8, got {buckets!r}")
    size = options.get("bucket_size", 128)
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"bucket_size must be a positive integer, got {size!r}")


def _has_tpu_input(inputs: Any) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in inputs)


def _enters_inference_mode(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph was traced under ``torch.inference_mode`` (Dynamo records entering it as a graph node, for
    the decorator and the context manager alike) or is being compiled for a call made under it."""
    from torch.autograd.grad_mode import _enter_inference_mode

    if torch.is_inference_mode_enabled():
        return True
    return any(node.op == "call_function" and node.target is _enter_inference_mode for node in gm.graph.nodes)


class _CompileLog:
    """Per compiled function: how many graphs it produced and the guard failures already reported."""

    def __init__(self) -> None:
        self.graphs: dict[Any, int] = {}
        self.failures_seen: dict[Any, int] = {}
        self.next_graph_id = 0

    def record(self, code: Any) -> tuple[int, bool, str]:
        from torch._dynamo.utils import guard_failures

        graph_id = self.next_graph_id
        self.next_graph_id += 1
        count = self.graphs.get(code, 0)
        self.graphs[code] = count + 1
        failures = guard_failures.get(code, []) if code is not None else []
        new_failures = failures[self.failures_seen.get(code, 0) :]
        self.failures_seen[code] = len(failures)
        if new_failures:
            return graph_id, True, str(new_failures[-1])
        return graph_id, False, "first call"


_log = _CompileLog()


def _current_code() -> Any:
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        return tx.f_code
    except Exception:  # no translator on the stack (e.g. the backend called directly)
        return None


def _run_materialised(forward: Callable[..., Any]) -> Callable[..., Any]:
    """The compiled callable: pending deferred work runs first, then the graph (op by op, or as XLA
    executables with ``--compiler xla``); outputs are real."""
    from tpu_agent.runtime.emulated import deferred, modes
    from tpu_agent.runtime.emulated.state import EagerMode

    @functools.wraps(forward)
    def compiled(*args: Any) -> Any:
        if state.eager_mode in state.DEFERRING_MODES:
            deferred.flush(FlushCause.COMPILE)
            with modes.set_eager_mode(EagerMode.DEFER_NEVER), compile_cache.graph_running():
                return forward(*args)
        with compile_cache.graph_running():
            return forward(*args)

    return compiled


_graph_serials = itertools.count()


def _graph_callable(
    gm: torch.fx.GraphModule, example_inputs: list[Any], name: str, site: events.Site | None, start: int
) -> Callable[..., Any]:
    from tpu_agent.runtime.xla import settings

    if settings.uses_xla():
        from tpu_agent.runtime.xla import dynamo

        return dynamo.compile_dynamo_graph(gm, example_inputs, name, site)  # its executables count their requests
    return _counted(gm.forward, time.perf_counter_ns() - start)


def _counted(forward: Callable[..., Any], compile_ns: int) -> Callable[..., Any]:
    """``forward``, one cache request per call (``torch.tpu._get_cache_stats``): the first a miss that took
    ``compile_ns`` to build, the rest hits. Each Dynamo graph is one executable (new shapes make a new graph)."""
    key = ("compiled graph", next(_graph_serials))

    @functools.wraps(forward)
    def run(*args: Any) -> Any:
        compile_cache.request(key, compile_ns)
        return forward(*args)

    return run


class TpuBackend:
    """The Dynamo backend registered as ``"tpu"``."""

    __name__ = "tpu"

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None, **kwargs: Any
    ) -> Callable[..., Any]:
        if kwargs:
            raise _unexpected(kwargs)
        validate_options(options)
        if not torch._dynamo.config.assume_static_by_default:
            raise NotImplementedError(DYNAMIC_MESSAGE)
        if _enters_inference_mode(gm):
            raise RuntimeError(INFERENCE_MODE_MESSAGE)
        start = time.perf_counter_ns()
        code = _current_code()
        graph_id, is_recompile, reason = _log.record(code)
        site = (
            events.Site(code.co_filename, code.co_firstlineno, code.co_name)
            if code is not None
            else events.user_call_site(2)
        )
        name = code.co_name if code is not None else gm.__class__.__name__
        compiled = _run_materialised(_graph_callable(gm, example_inputs, name, site, start))
        if state.log_enabled:
            events.emit(
                events.Compile,
                function=name,
                graph_id=graph_id,
                graph_ops=sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")),
                is_recompile=is_recompile,
                reason=reason,
                duration_ns=time.perf_counter_ns() - start,
                site=site,
            )
        return compiled


tpu_backend = TpuBackend()


def _select_backend() -> Callable[..., Any]:
    """``backend=None``: tpu when any example input is a tpu tensor, else the usual CPU default."""

    def select(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if _has_tpu_input(example_inputs):
            return tpu_backend(gm, example_inputs)
        from torch._dynamo.backends.registry import lookup_backend
        from torch._inductor import config as inductor_config

        name = "inductor" if inductor_config.cpp.cxx[0] is not None else "aot_eager"
        return lookup_backend(name)(gm, example_inputs)

    select.__name__ = "tpu_or_default"
    select._tpu_selector = True  # type: ignore[attr-defined]
    return select


def _guard_inductor(inductor: Any) -> Callable[..., Any]:
    def inductor_on_tpu(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        options = getattr(inductor, "config", None) or {}
        if _has_tpu_input(example_inputs) and options.get("tpu_backend") != "pallas":
            raise RuntimeError(INDUCTOR_MESSAGE)
        return inductor(gm, example_inputs)

    inductor_on_tpu.__name__ = "inductor"
    return inductor_on_tpu


def _is_tpu_backend(backend: Any) -> bool:
    return backend == "tpu" or isinstance(backend, TpuBackend) or getattr(backend, "_tpu_selector", False)


_registered = False
_EMULATION_MODULES = (
    "tensor", "mxu", "kernels", "cpu_gaps", "deferred", "debug", "telemetry", "memory", "unsupported", "autocast", "device",
    "modes", "device_guard", "autograd_queue", "compile_cache",
)  # fmt: skip


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _skip_emulation_frames() -> None:
    """Dynamo must not trace the device's own Python (dispatch runs inside compiled regions); mark every code
    object of the emulation's modules as skipped, which costs nothing per call."""
    import importlib

    from torch._dynamo.eval_frame import skip_code

    for name in _EMULATION_MODULES:
        module = importlib.import_module(f"tpu_agent.runtime.emulated.{name}")
        for value in vars(module).values():
            members = (
                vars(value).values() if isinstance(value, type) and value.__module__ == module.__name__ else [value]
            )
            for member in members:
                func = getattr(member, "__func__", member)
                func = getattr(func, "__wrapped__", func)
                code = getattr(func, "__code__", None)
                if code is not None and getattr(func, "__module__", None) == module.__name__:
                    for c in _code_objects(code):
                        skip_code(c)


def _break_reason(reason: str) -> str:
    """Dynamo's graph-break text in one line: its headline, and the explanation when it gives one (the headline
    alone can be "... Graph break encountered:", with what broke only in the explanation below it)."""
    lines = [line.strip() for line in reason.strip().splitlines()] if reason else []
    if not lines:
        return "unknown"
    explanation = next((line for line in lines[1:] if line.startswith("Explanation:")), None)
    return (lines[0] if explanation is None else f"{lines[0]} {explanation}")[:500]


def _register() -> None:
    """Register the backend, keep Dynamo out of the emulation's own frames and collectives, and log graph breaks."""
    global _registered
    if _registered:
        return
    _registered = True
    import torch._dynamo
    from torch._dynamo.backends.registry import register_backend
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    from tpu_agent.runtime.emulated import distributed, modes

    register_backend(compiler_fn=tpu_backend, name="tpu")
    _skip_emulation_frames()
    distributed.keep_dynamo_out()
    torch._dynamo.config.allow_rnn = True
    torch._dynamo.forbid_in_graph(modes.set_eager_mode)  # marks the function itself: Dynamo must not trace it
    original = InstructionTranslatorBase.log_graph_break

    def log_graph_break(self: Any, code_options: Any, reason: str, exc: Any) -> None:
        already = getattr(exc, "logged", False)
        original(self, code_options, reason, exc)
        if state.log_enabled and not already:
            stack = getattr(exc, "real_stack", None) or torch._guards.TracingContext.extract_stack()
            site = events.Site(stack[-1].filename, stack[-1].lineno or 0, stack[-1].name) if stack else None
            events.emit(events.GraphBreak, reason=_break_reason(reason), site=site)

    InstructionTranslatorBase.log_graph_break = log_graph_break


def install() -> None:
    """Wrap ``torch.compile`` with TorchTPU's defaults and refusals."""
    original = torch.compile

    @functools.wraps(original)
    def compile(model: Any = None, **kwargs: Any) -> Any:
        _register()
        backend = kwargs.get("backend")
        if backend is None:
            backend = kwargs["backend"] = _select_backend()
        elif backend == "inductor":
            inner = torch._TorchCompileInductorWrapper(
                kwargs.pop("mode", None), kwargs.pop("options", None), kwargs.get("dynamic"), None
            )
            kwargs["backend"] = _guard_inductor(inner)
        if _is_tpu_backend(backend):
            if kwargs.get("dynamic") is True:
                raise NotImplementedError(DYNAMIC_MESSAGE)
            kwargs.setdefault("dynamic", False)
            if kwargs.get("mode") is not None:
                raise _unexpected({"mode": kwargs["mode"]})
            validate_options(kwargs.get("options"))
        return original(model, **kwargs) if model is not None else original(**kwargs)

    torch.compile = compile
