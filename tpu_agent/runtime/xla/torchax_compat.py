"""The one place that makes ``torchax`` importable on this torch: every torchax import goes through :func:`load`.

torchax 0.0.13 builds module-level tables (autocast policies, decomposition lists) that name ATen overloads
by attribute, e.g. ``torch.ops.aten.prod.dim_Dimname``. Torch removed the named-tensor (``Dimname`` /
``names_*``) overloads, so those attribute reads raise ``AttributeError`` and the import fails, although
nothing a compiled graph contains ever reaches those entries (graphs never carry named-tensor ops). While
torchax imports, :func:`_tolerant_getattr` answers such a missing overload with an inert placeholder that
matches no real op; every other missing name still raises. Nothing stays patched after the import.

Second, torchax claims torch's PrivateUse1 device for itself at import (renames it "jax"), which the emulated
``tpu`` device already holds. Its tensors exist here only inside an XLA trace, standing for the CPU data of
tpu tensors, so the claim is skipped and they report the CPU device (device moves to "cpu" in a lowered graph
are then no-ops, as they are on the CPU data).

``tests/runtime/test_xla_compat.py`` fails as soon as a plain ``import torchax`` works, so this module is
deleted when it is no longer needed.
"""

from __future__ import annotations

import importlib
import re
import sys
import threading
from types import ModuleType
from typing import Any

import torch

# Overload names of the removed named-tensor variants (``dim_Dimname``, ``names_dim``, ``Dimname_Scalar``...).
NAMED_TENSOR_OVERLOAD = re.compile(r"(^|_)(Dimname|dimname|names)(_|$)")
_lock = threading.Lock()


class MissingOverload:
    """Stands for an overload this torch no longer has: hashable, equal only to itself, never callable."""

    def __init__(self, packet: str, name: str) -> None:
        self.qualified_name = f"{packet}.{name}"

    def __repr__(self) -> str:
        return f"<overload {self.qualified_name} removed from torch>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.qualified_name} does not exist in torch {torch.__version__}")


def needs_compat() -> bool:
    """Whether torchax fails to import without the layer (run in a fresh interpreter by the test)."""
    try:
        importlib.import_module("torchax").default_env()
    except AttributeError as error:
        return "Dimname" in str(error) or "names" in str(error)
    return False


def load() -> ModuleType:
    """``torchax``, imported with named-tensor overload names tolerated."""
    module = sys.modules.get("torchax")
    if module is not None and hasattr(module, "default_env"):
        return module
    with _lock:
        packet_type = torch._ops.OpOverloadPacket
        original = packet_type.__getattr__

        def _tolerant_getattr(self: Any, key: str) -> Any:
            try:
                return original(self, key)
            except AttributeError:
                if NAMED_TENSOR_OVERLOAD.search(key):
                    return MissingOverload(self._qualified_op_name, key)
                raise

        packet_type.__getattr__ = _tolerant_getattr
        rename, register = torch.utils.rename_privateuse1_backend, torch._register_device_module
        torch.utils.rename_privateuse1_backend = _skip_device_claim
        torch._register_device_module = _skip_device_claim
        try:
            for name in [n for n in sys.modules if n == "torchax" or n.startswith("torchax.")]:
                del sys.modules[name]  # a failed earlier plain import leaves half-initialised modules
            module = importlib.import_module("torchax")
            module.tensor.Tensor.device = property(lambda self: _CPU)
            module.default_env()  # its op tables and decomposition lists load lazily, here, still patched
            return module
        finally:
            packet_type.__getattr__ = original
            torch.utils.rename_privateuse1_backend, torch._register_device_module = rename, register


_CPU = torch.device("cpu")


def _skip_device_claim(*args: Any, **kwargs: Any) -> None:
    """torchax's PrivateUse1 rename and device module registration, skipped (see the module docstring)."""
