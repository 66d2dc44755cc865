"""``torch.backends.tpu``: the excess-precision switch as TorchTPU's precision notebook spells it.

TorchTPU 0.2.0 serves the setting as ``torch.tpu.allow_excess_precision``; its precision-management notebook
writes ``torch.backends.tpu.allow_excess_precision``. Both names read and write the one setting
(:data:`state.allow_excess_precision`), as documented: False by default, its first value taken from
``XLA_FLAGS`` (``--xla_allow_excess_precision``), and a change is a new compile (it is part of every compilation
cache key, so the next graph counts as a miss). The emulation itself never computes with excess precision:
eager ops on TorchTPU do not either, and compiled graphs only *may*.
"""

from __future__ import annotations

import os
import sys
import types

import torch

from tpu_agent.runtime.emulated import state
from tpu_agent.runtime.envvars import xla_flag

FLAG = "--xla_allow_excess_precision"


def excess_precision_from_xla_flags(flags: str | None) -> bool | None:
    """The value ``XLA_FLAGS`` gives the setting (the last mention wins; a bare flag means true), None if unset."""
    given = xla_flag(flags, FLAG)
    return None if given is None else given.strip().lower() not in ("false", "0", "no")


class BackendsTpu(types.ModuleType):
    """``torch.backends.tpu``."""

    @property
    def allow_excess_precision(self) -> bool:
        return state.allow_excess_precision

    @allow_excess_precision.setter
    def allow_excess_precision(self, value: bool) -> None:
        state.set_allow_excess_precision(bool(value))


def install() -> None:
    """Take the setting's first value from ``XLA_FLAGS`` and register ``torch.backends.tpu``."""
    from_flags = excess_precision_from_xla_flags(os.environ.get("XLA_FLAGS"))
    if from_flags is not None:
        state.set_allow_excess_precision(from_flags)
    module = BackendsTpu("torch.backends.tpu", "TorchTPU's backend switches on the tpu-agent emulated device")
    torch.backends.tpu = module
    sys.modules["torch.backends.tpu"] = module
