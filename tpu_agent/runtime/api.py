"""Public API of the runtime: launch a script on the ``tpu`` device, pick the backend, check the host.

``launch`` is what ``tpu-agent run``, ``tpu-agent profile`` and the MCP server call; ``activate`` is what
every launched process runs before user code (``tpu_agent.runtime.bootstrap`` calls it), and what a
notebook can call by hand to get the emulated ``tpu`` device in-process.
"""

from __future__ import annotations

import os
import sys

from tpu_agent.chips import DEFAULT_CHIP, get_chip
from tpu_agent.runtime.doctor import DoctorReport, doctor
from tpu_agent.runtime.envvars import (
    BACKEND_ENV,
    CHIP_ENV,
    eager_mode_from_env,
    recorded_env,
)
from tpu_agent.runtime.events import RunInfo, emit
from tpu_agent.runtime.options import LaunchTarget, RunOptions
from tpu_agent.runtime.select import BackendChoice, scan_tpu_devices, select_backend


def launch(target: LaunchTarget, options: RunOptions) -> int:
    """Run ``target`` under the runtime and return its exit code (as a shell would report it)."""
    from tpu_agent.runtime import (
        launcher,  # imports subprocess machinery only when something is launched
    )
    from tpu_agent.runtime.xla import settings

    requested = options.env.get(settings.COMPILER_ENV, os.environ.get(settings.COMPILER_ENV, ""))
    if requested.strip().lower() == settings.XLA and options.backend != "torch_tpu":
        settings.require_xla("--compiler xla")  # refused here, once, before any rank starts
    return launcher.launch(target, options)


_active: BackendChoice | None = None
_activating = False


def is_active() -> bool:
    """Whether :func:`activate` has made a backend live in this process."""
    return _active is not None


def is_activating() -> bool:
    """Whether :func:`activate` is running now: the ``import torch`` it causes must not start it again."""
    return _activating


def activate() -> BackendChoice:
    """Make the chosen backend live in this process; idempotent. Called by every rank before user code.

    The launcher has already resolved the backend into ``TPU_AGENT_BACKEND``; without it (a notebook
    calling this by hand) the ``auto`` rule decides here. With real torch_tpu nothing is patched: its
    autoload registers the device when torch is imported, so user code runs exactly as on a TPU VM.
    """
    global _active, _activating
    if _active is not None:
        return _active
    requested = os.environ.get(BACKEND_ENV)
    choice = BackendChoice(requested, f"{BACKEND_ENV}={requested}") if requested else select_backend("auto")
    _activating = True
    try:
        _activate(choice)
    finally:
        _activating = False
    _active = choice
    return choice


def _activate(choice: BackendChoice) -> None:
    """The emulation's device, modules and process group; with real torch_tpu only the run's RunInfo record."""
    mode, _ = eager_mode_from_env(os.environ)
    if choice.name == "emulated":
        from tpu_agent.runtime import emulated
        from tpu_agent.runtime.emulated import distributed

        # The emulation writes its own RunInfo record (with the eager mode it actually applied).
        emulated.activate(chip=os.environ.get(CHIP_ENV, DEFAULT_CHIP), eager_mode=mode.enum_name)
        distributed.register()
        from tpu_agent.runtime.xla import settings

        settings.install_deferred_executor()
        settings.announce_compiler_outputs()
    else:
        devices = scan_tpu_devices()
        emit(
            RunInfo,
            backend=choice.name,
            chip=devices[0].chip.key if devices else get_chip(os.environ.get(CHIP_ENV, DEFAULT_CHIP)).key,
            eager_mode=mode.enum_name,
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            argv=list(sys.argv),
            env=recorded_env(os.environ),
        )


__all__ = [
    "BackendChoice",
    "DoctorReport",
    "LaunchTarget",
    "RunOptions",
    "activate",
    "doctor",
    "is_active",
    "is_activating",
    "launch",
    "select_backend",
]
