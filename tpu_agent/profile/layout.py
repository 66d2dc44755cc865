"""Where a ``tpu-agent profile`` capture keeps its files, and the settings the profiled process reads.

The parent (:mod:`tpu_agent.profile.api`) writes ``options.json`` into the raw directory before the launch;
the capture hook in every rank reads its window from that one file (its only other input is the raw
directory itself, which the runtime's ``TPU_AGENT_EVENTS_DIR`` names), and the loader reads it back.
"""

from __future__ import annotations

from pathlib import Path

HOOK_SPEC = "tpu_agent.profile.capture:install"  # what TPU_AGENT_HOOKS names in every profiled rank
REPORT_DIR = "tpu-agent"  # next to plugins/ in the log directory: reports and raw files
RAW_DIR = "raw"
OPTIONS_FILE = "options.json"
TRACE_FILE = "rank{rank}.pt.trace.json"  # torch.profiler's Chrome trace of the measured window
CAPTURE_FILE = "capture-rank{rank}.json"  # what the capture hooks recorded (sites, weights, memory, ...)
COMPILED_FILE = "compiled.json"  # the TPU compiler's estimate of the step (`tpu-agent estimate`'s document)
VERIFIED_FILE = "verified.json"  # what checking each diff found (tpu_agent.profile.verify), for `diagnose` to reuse


def raw_dir(logdir: Path) -> Path:
    """Where a capture keeps its raw files: next to ``plugins/``, never inside an XProf session."""
    return logdir / REPORT_DIR / RAW_DIR


def report_dir(logdir: Path) -> Path:
    """Where the json/md/html reports go."""
    return logdir / REPORT_DIR
