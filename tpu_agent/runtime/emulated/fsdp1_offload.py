"""FSDP1's full state dict on the host: ``FullStateDictConfig(offload_to_cpu=True)`` under a sharded strategy.

To build a full state dict FSDP1 gathers each flat parameter on the device, then moves it to the CPU in place
(``FlatParamHandle.to_cpu``: ``flat_param.data = flat_param.cpu()``), so that the parameters its state-dict
hook clones, views of that flat parameter, are host tensors; afterwards it moves the flat parameter back. An
emulated tpu tensor is a wrapper whose device is fixed when it is made: it cannot become a CPU tensor in place.
So for a handle on the tpu device the in-place move is skipped (the emulated device's memory is host memory
already), and the parameters the hook would clone are copied to the host instead: the program gets what FSDP1
gives it on a GPU, CPU tensors, on rank 0 with ``rank0_only`` and on every rank without. Everything else FSDP1 does with storage
is :mod:`storage`'s.

Importing FSDP costs most of a second, so the patch waits for the program to import ``torch.distributed.fsdp``
(an import hook that steps aside once it has fired); a program that never uses FSDP pays nothing.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

_PACKAGE = "torch.distributed.fsdp"
_OFFLOADING = "_tpu_agent_offloading"  # set on a tpu handle while FSDP1 would hold its flat parameter on the CPU


def _to_cpu(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``FlatParamHandle.to_cpu`` that, for a handle on the tpu device, marks the handle instead of moving."""

    @contextlib.contextmanager
    def to_cpu(handle: Any) -> Iterator[None]:
        if handle.device.type != "tpu":
            with original(handle):
                yield
            return
        setattr(handle, _OFFLOADING, True)
        try:
            yield
        finally:
            setattr(handle, _OFFLOADING, False)

    return to_cpu


def _post_state_dict_hook(original: Callable[..., Any], module_handle: Callable[..., Any]) -> Callable[..., Any]:
    """FSDP1's shared post-state-dict hook, whose per-parameter hook copies its clone to the host while the
    module's handle is marked by :func:`_to_cpu`."""

    def hook(module: Any, fsdp_state: Any, state_dict: dict[str, Any], prefix: str, param_hook: Callable) -> Any:
        handle = module_handle(fsdp_state, module)
        if handle is None or not getattr(handle, _OFFLOADING, False):
            return original(module, fsdp_state, state_dict, prefix, param_hook)

        def to_host(state_dict: dict[str, Any], prefix: str, fqn: str) -> None:
            value = state_dict[fqn]
            if isinstance(value, torch.Tensor) and value.device.type == "tpu":
                # the host copy is the clone FSDP's hook would make on the device (its mark: no second one)
                state_dict[fqn] = host = value.detach().cpu()
                host._has_been_cloned = True
            param_hook(state_dict, prefix, fqn)

        return original(module, fsdp_state, state_dict, prefix, to_host)

    return hook


def _patch() -> None:
    from torch.distributed.fsdp import _flat_param, _state_dict_utils

    from tpu_agent.runtime.emulated import fsdp1_hybrid

    fsdp1_hybrid.patch()  # FSDP1's other patch, which waits for the same import

    handle_class = _flat_param.FlatParamHandle
    handle_class.to_cpu = _to_cpu(handle_class.to_cpu)
    _state_dict_utils._common_unshard_post_state_dict_hook = _post_state_dict_hook(
        _state_dict_utils._common_unshard_post_state_dict_hook, _state_dict_utils._module_handle
    )


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torch.distributed.fsdp`` with the path finder, runs it, patches it, then leaves ``sys.meta_path``
    (not while the import system walks that list: removing itself there would skip the next finder)."""

    def __init__(self) -> None:
        self._loader: Any = None

    def find_spec(
        self, name: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != _PACKAGE or self._loader is not None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None  # found some other way: imported unpatched, as without the emulation
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # type: ignore[union-attr]
        sys.meta_path.remove(self)
        self._loader.exec_module(module)
        _patch()


def install() -> None:
    """Patch FSDP1 now if the program has imported it, else when it does (once, at device registration)."""
    if _PACKAGE in sys.modules:
        _patch()
    else:
        sys.meta_path.insert(0, _PatchAfterImport())
