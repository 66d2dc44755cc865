"""The model: which root modules ran, the weights that feed their matmuls (with the line that defines each
layer), and the memory parameters, gradients and optimizer state hold."""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import re
import sys
import types
import weakref
from dataclasses import asdict
from typing import Any

from tpu_agent.profile.capture._probe import Probe, site_dict
from tpu_agent.profile.capture.steps import StepClock
from tpu_agent.runtime import events as ev

_ASSIGNMENT = re.compile(r"\s*self\.(\w+)\s*(?::[^=]+)?=")
_assignment_cache: dict[type, dict[str, int]] = {}


def _attribute_lines(cls: type) -> dict[str, int]:
    """``self.<name> = ...`` assignment lines in a module class's source, to name where a layer is built."""
    if cls not in _assignment_cache:
        lines: dict[str, int] = {}
        try:
            source, start = inspect.getsourcelines(cls)
        except (OSError, TypeError):
            source, start = [], 0
        for offset, text in enumerate(source):
            match = _ASSIGNMENT.match(text)
            if match and match.group(1) not in lines:
                lines[match.group(1)] = start + offset
        _assignment_cache[cls] = lines
    return _assignment_cache[cls]


def _weight_site(parent: Any, attr: str) -> ev.Site | None:
    cls = type(parent)
    line = _attribute_lines(cls).get(attr)
    if line is None:
        return None
    try:
        filename = inspect.getsourcefile(cls) or ""
    except TypeError:
        return None
    if ev.is_library_file(filename):
        return None
    return ev.Site(file=filename, line=line, function=f"{cls.__name__}.__init__")


def _statement_site() -> ev.Site | None:
    """The innermost user frame whose current line is a statement.

    A compiled function's frame reports its decorator or ``def`` line while Dynamo runs it; the useful line
    is then its caller's.
    """
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not ev.is_library_file(filename):
            text = linecache.getline(filename, frame.f_lineno).strip()
            if not text.startswith(("@", "def ", "async def ")):
                return ev.Site(file=filename, line=frame.f_lineno, function=frame.f_code.co_name)
        frame = frame.f_back
    return None


def _tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class ModuleProbe(Probe):
    """Finds the root modules during step 0 (forward pre-hooks, removed after it) and measures model state.

    Installed before the :class:`StepClock` so that its optimizer hook has seen the optimizer when the
    clock's hook ends step 0 and this probe measures what the optimizer holds.
    """

    def __init__(self, clock: StepClock) -> None:
        super().__init__()
        self.clock = clock
        self.roots: dict[int, Any] = {}
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.forward_site: ev.Site | None = None
        self.module_types: list[str] = []
        self.weights: list[dict[str, Any]] = []
        self.memory: dict[str, int] | None = None
        self.depth = 0
        self.forward_hooks: list[Any] = []
        self.compile_callback: Any = None
        self.discovered = False

    def install(self) -> None:
        import torch
        from torch.nn.modules import module as module_mod
        from torch.optim import optimizer as optimizer_mod

        is_compiling = torch.compiler.is_compiling

        def pre(module: Any, args: Any) -> None:
            if is_compiling():
                return
            if self.depth == 0:
                self.clock.first_activity()
                self.roots.setdefault(id(module), module)
                self.forward_site = self.forward_site or _statement_site()
            self.depth += 1

        def post(module: Any, args: Any, output: Any) -> None:
            if not is_compiling():
                self.depth = max(self.depth - 1, 0)

        self.forward_hooks = [
            module_mod.register_module_forward_pre_hook(pre),
            module_mod.register_module_forward_hook(post, always_call=True),
        ]
        handle = optimizer_mod.register_optimizer_step_post_hook(lambda optimizer, *_: self.optimizers.add(optimizer))
        self.on_undo(handle.remove)
        self.on_undo(self._remove_forward_hooks)
        original_compile = torch.compile

        @functools.wraps(original_compile)
        def compile(*args: Any, **kwargs: Any) -> Any:
            self._unhook_before_compiling()
            return original_compile(*args, **kwargs)

        torch.compile = compile
        self.on_undo(lambda: setattr(torch, "compile", original_compile))
        self.clock.listeners.append(self._after_step)

    def _after_step(self, finished: int) -> None:
        if finished == 0:
            self._discover()
        if finished <= 1:  # step 1 again: optimizers create their state lazily in their first step
            self._measure()

    def _unhook_before_compiling(self) -> None:
        """Remove the global forward hooks as Dynamo starts each compile, before it traces anything.

        Dynamo guards a compiled module call on how many global forward hooks there are; a graph traced while these
        hooks were installed would be recompiled in step 1, once they are gone: a recompile the profile itself
        caused, whose guard (``len(_global_forward_hooks) != 1``) then hides the script's own reason when a later
        guard fails (a ``requires_grad`` change). The roots called before the compile (a compiled module's wrapper)
        are already seen; modules called inside a compiled region were never roots (the hooks skip while compiling).
        Registered from ``torch.compile`` (wrapped at install): importing Dynamo for every eager script costs
        seconds."""
        if self.compile_callback is not None:
            return
        from torch._dynamo.callback import callback_handler

        def started(*_: object) -> None:
            self._remove_forward_hooks()

        self.compile_callback = callback_handler.register_start_callback(started)

        def unregister() -> None:
            with contextlib.suppress(ValueError):
                callback_handler.remove_start_callback(started)

        self.on_undo(unregister)

    def _remove_forward_hooks(self) -> None:
        for handle in self.forward_hooks:
            handle.remove()
        self.forward_hooks = []

    def _discover(self) -> None:
        import torch

        self._remove_forward_hooks()
        self.discovered = True
        seen: set[int] = set()
        for root in self.roots.values():
            self.module_types.append(type(root).__name__)
            for qualname, module in root.named_modules():
                weight = getattr(module, "weight", None)
                if not isinstance(weight, torch.Tensor) or weight.dim() < 2 or id(weight) in seen:
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

    def _measure(self) -> None:
        import torch

        params: dict[int, Any] = {}
        for root in self.roots.values():
            params.update((id(p), p) for p in root.parameters())
        optimizer_tensors: dict[int, Any] = {}
        for optimizer in list(self.optimizers):
            for group in optimizer.param_groups:
                params.update((id(p), p) for p in group["params"])
            for state in optimizer.state.values():
                optimizer_tensors.update(
                    (id(v), v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0
                )
        self.memory = {
            "param_bytes": _tensor_bytes(params.values()),
            "grad_bytes": _tensor_bytes(p.grad for p in params.values() if p.grad is not None),
            "optimizer_bytes": _tensor_bytes(optimizer_tensors.values()),
        }

    def uninstall(self) -> None:
        super().uninstall()
        if not self.discovered:  # the script never completed a step: describe what ran anyway
            self._discover()
            self._measure()

    def record(self) -> dict[str, Any]:
        return {
            "forward_site": site_dict(self.forward_site),
            "module_types": self.module_types,
            "weights": self.weights,
            "memory": self.memory,
        }
