"""``with tpu_agent.profile.step():``: the step marker user code calls, and where the capture receives it.

Kept apart from the capture probes so that ``import tpu_agent.profile`` (which every ``tpu-agent`` command
and every annotated script does) loads neither them nor anything that imports this package back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from tpu_agent.runtime import events as ev


class StepReceiver(Protocol):
    def begin(self, source: str) -> None: ...

    def end(self, source: str, site: ev.Site | None) -> None: ...


_receiver: StepReceiver | None = None


def receive_steps(receiver: StepReceiver | None) -> None:
    """Route ``step()`` marks to ``receiver`` (the capture's step clock); ``None`` makes ``step()`` a no-op."""
    global _receiver
    _receiver = receiver


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one step for scripts without an optimizer: ``with tpu_agent.profile.step(): ...``.

    Outside ``tpu-agent profile`` this does nothing, so the annotation can stay in the code.
    """
    receiver = _receiver
    if receiver is not None:
        receiver.begin("annotation")
    try:
        yield
    finally:
        if receiver is not None:
            receiver.end("annotation", ev.user_call_site(3))
