"""The ``tpu`` device in every process a run starts, through torch's device-backend autoload.

On a TorchTPU host every Python process that imports torch gets the ``tpu`` device: the torch_tpu wheel declares
an entry point in the ``torch.backends`` group, and ``import torch`` calls it (unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). tpu-agent declares one too (:func:`load`, pyproject.toml), so a ``python``
child, a ``torch.multiprocessing.spawn`` worker, a spawn-context DataLoader worker or a ``python -m
torch.distributed.run`` the user's code starts itself gets the device the same way, at the same moment.

It is switched on only by the run: :func:`load` does nothing unless ``TPU_AGENT_BACKEND=emulated``, which
``tpu-agent run`` sets in the environment every process of the run inherits. Any other ``import torch`` in the
same virtualenv (the test suite, a notebook, the CLI) pays one environment lookup and gets no device.

Two processes of a run are left alone, told apart by their command line (``sys.orig_argv``), because torch may be
imported in them before any of their own code runs (a ``sitecustomize`` that imports torch): the rank's bootstrap
(it activates after its own checks, and logs as the rank) and torchrun's elastic agent (it supervises and runs no
user code). Every other process is one the user's code started: its events go to a file of its own beside its
rank's (:func:`tpu_agent.runtime.events.log_as_started_process`).

The run also puts :data:`~tpu_agent.runtime.run_scope.SURFACE_DIR` on ``PYTHONPATH`` when the real torch_tpu is not installed, so ``import
torch_tpu`` finds the emulation's face of TorchTPU's Python modules (:mod:`tpu_agent.runtime.emulated.surface`).
"""

from __future__ import annotations

from tpu_agent.runtime.run_scope import requested, runs_itself


def activate() -> None:
    """Make the device live in this process now (idempotent): what ``torch_tpu._loader.load()`` asks for.

    A process the run started but did not activate itself logs its events in a file of its own first."""
    from tpu_agent.runtime import api, events

    if api.is_activating():
        return  # torch is being imported by activate() itself
    if requested() and not runs_itself() and not api.is_active():
        events.log_as_started_process()  # before activation writes the process's RunInfo
    api.activate()


def load() -> None:
    """torch's ``torch.backends`` entry point: activate the emulation in a process the run started, else nothing."""
    if not requested() or runs_itself():
        return
    activate()


__all__ = ["activate", "load"]
