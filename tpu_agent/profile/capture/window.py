"""The op trace: ``torch.profiler`` on for the measured steps only, its Chrome trace written when they end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpu_agent.fsutil import atomic_write_with
from tpu_agent.profile.capture._probe import Probe
from tpu_agent.profile.capture.steps import StepClock
from tpu_agent.profile.layout import TRACE_FILE


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
        return {"warnings": list(self.warnings)}
