"""Activate the runtime in processes a rank starts with the ``spawn`` or ``forkserver`` start method.

On a TorchTPU host every Python process that imports torch gets the ``tpu`` device (torch_tpu's autoload), so
``torch.multiprocessing.spawn(main_worker, ...)``, ``start_processes`` and DataLoader workers with
``multiprocessing_context="spawn"`` all see it. Under ``tpu-agent run`` only the rank process is activated by
the bootstrap; a spawned child is a fresh interpreter that would never call :func:`activate`.

Mechanism, and why this one: the rank wraps ``multiprocessing.spawn.get_preparation_data`` so the dict a
parent sends every spawn/forkserver child carries one extra entry, an :class:`_ActivateOnLoad` token. The
child unpickles that dict (``multiprocessing.spawn._main``) before ``prepare`` re-imports the user's
``__main__`` and before it unpickles the target, and unpickling the token imports this module and
activates the runtime. So activation happens exactly where torch_tpu's autoload would, with nothing put
on disk (no ``.pth``/``sitecustomize``), no change to the child's command line, and only stdlib-public
behaviour relied upon: ``prepare`` ignores keys it does not know, and every start method that re-imports
``__main__`` (spawn, forkserver; on all platforms) goes through ``get_preparation_data``. ``fork``
children inherit the parent's activated interpreter and need nothing.

The child inherits the rank's environment, so it makes the same choices: backend (``TPU_AGENT_BACKEND``),
chip and host device count (``TPU_AGENT_CHIP``, ``LOCAL_WORLD_SIZE``), eager mode (``TORCH_TPU_*``), hooks
environment, and event log directory. ``RANK`` is not changed (a ``mp.spawn`` worker picks its own distributed
rank and passes it to ``init_process_group``), so the child's events are tagged with its parent's rank but go to
a file of the child's own beside the rank's (:func:`tpu_agent.runtime.events.log_as_started_process`): readers
see one process per file and choose whether to count the workers.
"""

from __future__ import annotations

import multiprocessing.spawn
from collections.abc import Callable
from typing import Any

_KEY = "tpu_agent_activate"  # the extra preparation-data entry; prepare() skips unknown keys


def _activate_in_child() -> None:
    """Run in a spawned child while its preparation data is unpickled: activate, and pass the hook on."""
    from tpu_agent.runtime import events
    from tpu_agent.runtime.api import activate

    events.log_as_started_process()  # before activation writes the child's RunInfo
    activate()
    install()  # the child's own spawned children (e.g. DataLoader workers of an mp.spawn worker) too


class _ActivateOnLoad:
    """A marker whose unpickling (in the child) calls :func:`_activate_in_child`."""

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return _activate_in_child, ()


_original: Callable[[str], dict[str, Any]] | None = None


def _preparation_data(name: str) -> dict[str, Any]:
    assert _original is not None
    data = _original(name)
    data[_KEY] = _ActivateOnLoad()
    return data


def install() -> None:
    """Make every spawn/forkserver child of this process activate the runtime first (idempotent)."""
    global _original
    if _original is not None:
        return
    _original = multiprocessing.spawn.get_preparation_data
    multiprocessing.spawn.get_preparation_data = _preparation_data


__all__ = ["install"]
