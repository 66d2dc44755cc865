"""Functional collectives' ``AsyncCollectiveTensor`` on emulated ``tpu`` tensors.

``torch.distributed._functional_collectives`` (DTensor's redistribute and ``full_tensor``, FSDP2's gradient-norm
reduction, user code calling ``funcol.all_reduce``) returns each result wrapped in an ``AsyncCollectiveTensor``
through the custom op ``_c10d_functional::_wrap_tensor_autograd``. On a device tensor that op runs its Python
body and the wrapper holds the device tensor; the result's ``.wait()``, and DTensor's own wait on it, pop the
collective's work from c10d's registry. The emulated tensor is a dispatch subclass, so the op would reach its
``__torch_dispatch__``, run on the CPU data and come back as a plain ``tpu`` tensor: ``.wait()`` would not exist,
nothing would wait, and c10d would warn at exit about collectives never waited for. A torch-dispatch rule for
the subclass gives the op its device behaviour (torch consults it before ``__torch_dispatch__``).
"""

from __future__ import annotations

from typing import Any

import torch

from tpu_agent.runtime.emulated.tensor import TpuTensor

_WRAP_OP = "_c10d_functional::_wrap_tensor_autograd"
_registered = False


def _wrap(subclass: type, func: Any, types: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return AsyncCollectiveTensor(args[0])


def patch() -> None:
    """Register the rule (idempotent; imports the functional collectives only when a process group is made)."""
    global _registered
    if _registered:
        return
    import torch.distributed._functional_collectives  # noqa: F401  # defines the op

    torch.library.register_torch_dispatch(_WRAP_OP, TpuTensor, _wrap)
    _registered = True
