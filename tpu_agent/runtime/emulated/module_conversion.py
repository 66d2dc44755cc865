"""``Module.to(dtype)``, ``.half()``, ``.bfloat16()`` on tpu parameters under DeferAndFuse.

torch converts the parameters of a module whose tensors are a wrapper subclass (the emulated ``tpu`` tensor is one)
with ``torch.utils.swap_tensors(param, converted)``, which exchanges the contents of the two Python objects. Under
DeferAndFuse ``converted`` is still the pending output of a recorded ``_to_copy`` that reads ``param``; after the
swap the recorded op would read the object that now holds the pending state, and the next flush fails with "this
tpu tensor has no data" (TorchTPU's guides write ``model.to(device).to(torch.bfloat16)`` in every mode). Running
the pending graph before a swap that involves a tpu tensor gives both objects their data, so the swap exchanges
real tensors, as in Strict Eager. A swap of CPU tensors is left alone.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.utils

from tpu_agent.runtime.emulated import tensor as tt
from tpu_agent.runtime.emulated.flush_cause import FlushCause


def install() -> None:
    """Wrap ``torch.utils.swap_tensors`` (idempotent); ``nn.Module._apply`` looks it up at each call."""
    original = torch.utils.swap_tensors
    if getattr(original, "_tpu_agent_flushes_first", False):
        return

    @functools.wraps(original)
    def swap_tensors(t1: Any, t2: Any) -> Any:
        if type(t1) is tt.TpuTensor or type(t2) is tt.TpuTensor:
            tt.flush_pending(FlushCause.SWAP_TENSORS)
        return original(t1, t2)

    swap_tensors._tpu_agent_flushes_first = True  # type: ignore[attr-defined]
    torch.utils.swap_tensors = swap_tensors


__all__ = ["install"]
