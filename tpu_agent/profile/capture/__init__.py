"""The in-process half of ``tpu-agent profile``: what every rank records while the script runs.

:func:`tpu_agent.profile.api.profile` (the parent) writes ``options.json`` into the raw directory and
launches the script through the runtime with ``TPU_AGENT_EVENTS_DIR`` naming that directory and
``TPU_AGENT_HOOKS`` naming :func:`install`. In every rank, before user code, :func:`install` reads the
measured window from ``options.json`` (the child's only source of settings) and installs one probe per
concern:

* :mod:`.steps` - step boundaries (optimizer step, else ``with tpu_agent.profile.step():``);
* :mod:`.window` - ``torch.profiler`` over the measured steps, written as ``rank<R>.pt.trace.json``;
* :mod:`.modules` - the root modules, their matmul weights (with defining lines) and model-state memory;
* :mod:`.dataloader` - DataLoader settings and time spent waiting for batches;
* :mod:`.host_syncs` - device-to-host reads, where the emulated device does not report them itself;
* :mod:`.dynamo` - graph breaks and recompiles from Dynamo's logs;
* :mod:`.losses` - the first steps' losses, which verification compares between the run and a patched copy.

The generators are seeded (:func:`seed_generators`) so that two runs of one script draw the same numbers.
With ``stop_after_window`` in ``options.json`` (verification's runs) the script stops once the window has ended.

At exit their records go to ``capture-rank<R>.json`` next to the event log; :mod:`tpu_agent.profile.load`
reads it all back into the :class:`~tpu_agent.profile.model.ProfileModel`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_agent.fsutil import atomic_write_text
from tpu_agent.profile.capture._probe import Probe
from tpu_agent.profile.capture.dataloader import DataLoaderProbe
from tpu_agent.profile.capture.dynamo import DynamoProbe
from tpu_agent.profile.capture.host_syncs import HostSyncProbe
from tpu_agent.profile.capture.losses import LossProbe
from tpu_agent.profile.capture.modules import ModuleProbe
from tpu_agent.profile.capture.steps import StepClock
from tpu_agent.profile.capture.window import ProfilerWindow
from tpu_agent.profile.layout import CAPTURE_FILE, HOOK_SPEC, OPTIONS_FILE
from tpu_agent.profile.marker import receive_steps
from tpu_agent.profile.options import DEFAULT_STEPS, DEFAULT_WARMUP
from tpu_agent.runtime import events as ev

_active: _Recorder | None = None


def _emulated_device_active() -> bool:
    emulation = sys.modules.get("tpu_agent.runtime.emulated")
    return bool(emulation is not None and emulation.is_active())


class _Recorder:
    """The probes of one process, installed in an order that matters (see :class:`ModuleProbe`)."""

    def __init__(self, out_dir: Path, steps: int, warmup: int, stop_after_window: bool = False) -> None:
        self.out_dir = out_dir
        self.rank = int(os.environ.get("RANK", "0"))
        emulated = _emulated_device_active()
        self.clock = StepClock(warmup=warmup, steps=steps, emulated=emulated, stop_after_window=stop_after_window)
        probes: list[Probe] = [ModuleProbe(self.clock), self.clock, DataLoaderProbe(self.clock)]
        if not emulated:
            probes.append(HostSyncProbe(self.clock))
        probes += [DynamoProbe(emulated), ProfilerWindow(self.clock, out_dir, self.rank), LossProbe()]
        self.probes = probes

    def install(self) -> None:
        for probe in self.probes:
            probe.install()

    def finish(self) -> None:
        """At exit: undo every patch, stop the profiler, write ``capture-rank<R>.json``, flush the event log."""
        for probe in reversed(self.probes):
            probe.uninstall()
        record: dict[str, Any] = {"rank": self.rank, "host": os.uname().nodename, "warnings": []}
        for probe in self.probes:
            part = probe.record()
            record["warnings"] += part.pop("warnings", [])
            record.update(part)
        atomic_write_text(self.out_dir / CAPTURE_FILE.format(rank=self.rank), json.dumps(record))
        self.clock.log.flush()


def _window_settings(out_dir: Path) -> tuple[int, int, bool]:
    """Measured steps, warm-up and whether to stop after them, from the parent's ``options.json`` (defaults when a
    key is absent)."""
    options = json.loads((out_dir / OPTIONS_FILE).read_text(encoding="utf-8"))
    return (
        int(options.get("steps", DEFAULT_STEPS)),
        int(options.get("warmup", DEFAULT_WARMUP)),
        bool(options.get("stop_after_window", False)),
    )


SEED = 0


def seed_generators() -> None:
    """Seed Python's, torch's and (when installed) NumPy's generators before user code runs.

    Verification compares the first losses of the run and of a patched copy (:mod:`tpu_agent.profile.verify`):
    a script that never seeds (``torch.randn`` batches, a shuffled DataLoader) would draw other numbers in each
    run and no fix could be told from noise. A script that seeds itself overrides this."""
    import random

    import torch

    random.seed(SEED)
    torch.manual_seed(SEED)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(SEED)


def install() -> Callable[[], None] | None:
    """``TPU_AGENT_HOOKS`` entry point: start recording in this process; returns the at-exit finisher.

    Does nothing outside a ``tpu-agent profile`` launch (no event directory with the parent's options).
    """
    global _active
    directory = os.environ.get(ev.EVENTS_DIR_ENV)
    if not directory or _active is not None or not (Path(directory) / OPTIONS_FILE).is_file():
        return None
    out_dir = Path(directory)
    steps, warmup, stop = _window_settings(out_dir)
    recorder = _Recorder(out_dir, steps=steps, warmup=warmup, stop_after_window=stop)
    recorder.install()
    seed_generators()
    receive_steps(recorder.clock)
    _active = recorder
    return recorder.finish


__all__ = ["HOOK_SPEC", "install"]
