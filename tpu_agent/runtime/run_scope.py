"""Which processes of a run get the emulated ``tpu`` device: the facts :mod:`.autoload` decides by.

A leaf module (it imports nothing of tpu_agent): torch imports :mod:`.autoload` on every ``import torch`` in the
environment, and the launcher, the backend selection and the environment-variable table read the same facts, so
they live here, where none of those imports can close a circle through :mod:`.autoload`'s activation.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

#: The resolved backend of a run ("emulated" or "torch_tpu"), set by the launcher and inherited by every process it
#: starts. Defined here, not in :mod:`.envvars` (which re-exports it), because torch imports :mod:`.autoload` on every
#: ``import torch`` in the environment: it must import nothing heavy.
BACKEND_ENV = "TPU_AGENT_BACKEND"
#: The directory that holds the ``torch_tpu`` package of the emulation; a path entry, not a package.
SURFACE_DIR = Path(__file__).resolve().parent / "emulated" / "surface"

#: The run's own processes (``python -m MODULE``), which activate the runtime themselves or must not have it
SELF_ACTIVATING = ("tpu_agent.runtime.bootstrap", "tpu_agent.runtime.elastic")


def runs_itself(argv: list[str] | None = None) -> bool:
    """Whether this process (command line ``argv``, default ``sys.orig_argv``) is the rank's bootstrap or the agent."""
    args = list(getattr(sys, "orig_argv", [])) if argv is None else argv
    return any(flag == "-m" and module in SELF_ACTIVATING for flag, module in zip(args, args[1:], strict=False))


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the run asked for the emulated device in this process's environment."""
    env = os.environ if environ is None else environ
    return env.get(BACKEND_ENV) == "emulated"


__all__ = ["BACKEND_ENV", "SELF_ACTIVATING", "SURFACE_DIR", "requested", "runs_itself"]
