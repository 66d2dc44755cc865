"""The op trace: ``torch.profiler`` on for the measured steps only, its Chrome trace written when they end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpu_agent.fsutil import atomic_write_with
from tpu_agent.profile.capture._probe import Probe
from tpu_agent.profile.capture.steps import StepClock
from tpu_agent.profile.layout import TRACE_FILE


def eager_mode_now() -> str | None:
    """The eager mode in force (``torch.tpu.eager_mode``'s name), read as the window begins: TorchTPU's docs switch
    to Fused eager in the script (``torch.tpu.eager_mode = EagerMode.DEFER_AND_FUSE``), after the run's start-up
    recorded the environment's mode; the fused-eager rules must see the mode the measured steps ran in."""
    import torch

    mode = getattr(getattr(torch, "tpu", None), "eager_mode", None)
    name = getattr(mode, "name", None)
    return name if isinstance(name, str) else None


class ProfilerWindow(Probe):
    """Starts as the first measured step begins and stops after the last.

    Kineto starts in under a millisecond, and a step recorded before the window would only add op records to
    stop, convert and analyse. ``profile.step()`` is not used: the runtime treats it as the user's own step
    marker.
    """

    def __init__(self, clock: StepClock, out_dir: Path, rank: int) -> None:
        super().__init__()
        self.clock = clock
        self.trace_path = out_dir / TRACE_FILE.format(rank=rank)
        self.prof: Any = None
        self.tried = False
        self.warnings: list[str] = []
        self.eager_mode: str | None = None

    def install(self) -> None:
        self.clock.listeners.append(lambda _finished: self.advance())
        self.advance()

    def advance(self) -> None:
        first, last = self.clock.window
        step = self.clock.step
        if self.prof is None and not self.tried and step >= first:
            self._start()
        elif self.prof is not None and step > last:
            self.stop()

    def _start(self) -> None:
        from torch.autograd import profiler as autograd_profiler
        from torch.profiler import ProfilerActivity, profile

        self.tried = True  # one attempt: on failure the window stays without an op trace
        self.eager_mode = eager_mode_now()
        if autograd_profiler._is_profiler_enabled:
            self.warnings.append("the script runs its own torch.profiler: no op trace was recorded")
            return
        # Shapes, not allocations: profile_memory would cost ~25 % more per op; memory comes from the
        # runtime's per-step samples and from the model state measured directly.
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        try:
            prof.start()
        except RuntimeError as error:
            self.warnings.append(f"torch.profiler could not start: {error}")
            return
        self.prof = prof

    def stop(self) -> None:
        prof, self.prof = self.prof, None
        if prof is None:
            return
        prof.stop()
        # torch writes the Chrome trace in C++ (a fraction of what converting its records in Python costs, in
        # the middle of the user's run); the parent parses it while the script goes on. Atomic, because the
        # parent reads the file as soon as it appears.
        atomic_write_with(self.trace_path, prof.profiler.kineto_results.save)

    def uninstall(self) -> None:
        self.stop()
        super().uninstall()

    def record(self) -> dict[str, Any]:
        return {"warnings": list(self.warnings), "window_eager_mode": self.eager_mode}
