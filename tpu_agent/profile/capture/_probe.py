"""What every capture probe shares: the step clock it reads and a way to patch torch and undo it at exit."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from tpu_agent.runtime import events as ev


def site_dict(site: ev.Site | None) -> dict[str, Any] | None:
    return asdict(site) if site else None


def direct_caller_is_user(depth: int) -> bool:
    """True when the frame ``depth`` levels up is user code (not torch, not us, not the stdlib)."""
    frame = sys._getframe(depth + 1)
    return not ev.is_library_file(frame.f_code.co_filename)


class Probe:
    """One concern of the in-process capture: installs its hooks, records, and adds its part to the record.

    Patches are undone in reverse order at :meth:`uninstall`, so a script that outlives the capture (an
    ``atexit`` of its own) runs on unpatched torch.
    """

    def __init__(self) -> None:
        self._restore: list[Callable[[], None]] = []

    def install(self) -> None:
        """Hook into torch; called once, before user code runs."""

    def patch(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._restore.append(lambda: setattr(owner, name, original))

    def on_undo(self, undo: Callable[[], None]) -> None:
        self._restore.append(undo)

    def uninstall(self) -> None:
        for undo in reversed(self._restore):
            undo()
        self._restore.clear()

    def record(self) -> dict[str, Any]:
        """This probe's part of ``capture-rank<R>.json``."""
        return {}
