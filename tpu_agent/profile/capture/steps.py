"""Step boundaries: the optimizer's step, else the user's ``with tpu_agent.profile.step():``.

The emulated device marks optimizer steps itself (and counts torch.profiler steps as user steps), so on it
the clock only follows the step count; elsewhere it writes the runtime's StepMarker records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpu_agent.profile.capture._probe import Probe, site_dict
from tpu_agent.runtime import events as ev


class StepClock(Probe):
    """Counts steps and tells the other probes when one ends (``listeners`` get the finished step's index)."""

    def __init__(self, warmup: int, steps: int, emulated: bool, stop_after_window: bool = False) -> None:
        super().__init__()
        self.stop_after_window = stop_after_window
        self.log = ev.get_log()
        self.emulated = emulated
        self.window = (warmup, warmup + steps - 1)  # first and last measured step
        self.step = 0
        self.source: str | None = None  # optimizer | annotation: the first to end a step wins
        self.started = False
        self.site: ev.Site | None = None
        self.listeners: list[Callable[[int], None]] = []

    @property
    def in_analysed_steps(self) -> bool:
        """True until the window's last step ends: what later steps record, the analysis never reads."""
        return self.step <= self.window[1]

    def install(self) -> None:
        from torch.optim import optimizer as optimizer_mod

        handle = optimizer_mod.register_optimizer_step_post_hook(self._after_optimizer_step)
        self.on_undo(handle.remove)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.end("optimizer", ev.user_call_site(2))

    def _marks(self, source: str) -> bool:
        return not (self.emulated and source == "optimizer")

    def begin(self, source: str) -> None:
        if self.source not in (None, source) or self.started:
            return
        self.started = True
        if self._marks(source):
            self.log.step = self.step
            ev.emit(ev.StepMarker, phase="begin", source=source)

    def end(self, source: str, site: ev.Site | None) -> None:
        if self.source is None:
            self.source = source
        if self.source != source:
            return
        if not self.started:
            self.begin(source)
        self.site = self.site or site
        if self._marks(source):
            ev.emit(ev.StepMarker, phase="end", source=source)
            self.log.step = self.step + 1
        finished = self.step
        self.step += 1
        self.started = False
        for listener in self.listeners:
            listener(finished)
        if self.stop_after_window and finished >= self.window[1]:
            # Verification's runs need the window only: a clean exit (atexit writes the capture) bounds their cost.
            raise SystemExit(0)
        if source == "optimizer":
            self.begin(source)

    def first_activity(self) -> None:
        """The script touched its model or data: with optimizer steps, step 0 begins here."""
        if self.step == 0 and not self.started and self.source in (None, "optimizer"):
            self.begin("optimizer")

    def record(self) -> dict[str, Any]:
        return {
            "steps_completed": self.step,
            "step_source": self.source,
            "window": list(self.window),
            "step_site": site_dict(self.site),
        }
