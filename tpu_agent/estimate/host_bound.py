"""When ``tpu-agent estimate`` must stop computing: the host-memory bound that switches a run to capture-only.

``estimate`` runs a script for real by default (its values are then real: ``loss.item()``, branches on tensors),
but a model sized for a TPU slice does not fit the host that estimates it: the kernel kills the run (a 0.7B GPT's
case is in docs/estimate.md). The bound (``--host-memory``, by default a quarter of the host's RAM) is checked

* as the model is built: each registered parameter adds its bytes, and training needs about
  :data:`TRAINING_COPIES` times those (weights, gradients, two AdamW moments), so the run switches before the
  model is complete, not after the optimizer has tripled it;
* at every graph flush, against the process's resident memory (activations of a small model with a large batch).

Past it the process switches to capture-only for the rest of the run (:func:`capture_only.install`): tensors that
have data keep it, everything made afterwards has none, and the estimate says when and why it switched.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tpu_agent.estimate.report import human_bytes
from tpu_agent.runtime import events

TRAINING_COPIES = 4  # weights, gradients and AdamW's two moments, per parameter byte
DEFAULT_SHARE = 0.25  # of the host's RAM: room for the interpreter, torch, JAX and the compiler beside it


def host_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_bound_bytes() -> int:
    """A quarter of the host's RAM."""
    return int(host_ram_bytes() * DEFAULT_SHARE)


def resident_bytes() -> int:
    """This process's resident memory now (Linux; 0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


COUNTED_MARK = "_tpu_agent_host_bound_counted"


@dataclass
class HostBound:
    """Watches parameter bytes and resident memory against ``bound``; calls ``switch`` once, past it."""

    bound: int
    switch: Callable[[], None]
    parameter_bytes: int = 0
    chosen: str | None = None  # why the run switched to capture-only, once it has

    def _choose(self, reason: str) -> None:
        self.chosen = (
            f"capture-only chosen by estimate: {reason}, past the host-memory bound of {human_bytes(self.bound)} "
            "(--host-memory); values computed before it are real, everything after was recorded from shapes"
        )
        self.switch()

    def parameter_registered(self, module: torch.nn.Module, name: str, parameter: Any) -> None:
        """Global parameter-registration hook: counts bytes; never replaces the parameter itself (the
        capture-only hook registered after it does, once the switch is made)."""
        if self.chosen is not None or not isinstance(parameter, torch.Tensor) or parameter.is_meta:
            return
        # a tied weight (``head.weight = embedding.weight``) is registered twice and held once: the parameter carries
        # its own mark (a weak reference would stop Module.to() from swapping it; tensors compare by value)
        if getattr(parameter, COUNTED_MARK, False):
            return
        setattr(parameter, COUNTED_MARK, True)
        self.parameter_bytes += parameter.numel() * parameter.element_size()
        if self.parameter_bytes * TRAINING_COPIES > self.bound:
            site = events.user_call_site(2)
            where = f" at {site.file}:{site.line}" if site is not None else ""
            self._choose(
                f"the model's parameters reached {human_bytes(self.parameter_bytes)}{where}, and training them needs about "
                f"{TRAINING_COPIES}x that ({human_bytes(self.parameter_bytes * TRAINING_COPIES)}: weights, gradients, two "
                "optimizer moments)"
            )

    def flushed(self, graph: Any) -> None:
        """Flush observer: the process's resident memory against the bound."""
        if self.chosen is None and (resident := resident_bytes()) > self.bound:
            self._choose(f"the process held {human_bytes(resident)} of host memory")
