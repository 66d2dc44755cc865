"""How to profile: the measured window and where and how to run, with the defaults and limits that the CLI
(``tpu-agent profile``) and the MCP server (``tpu_profile``) both take from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tpu_agent.chips import DEFAULT_CHIP, get_chip
from tpu_agent.errors import TpuAgentError

DEFAULT_STEPS = 10  # measured steps: enough for a stable median without a long run
DEFAULT_WARMUP = 2  # steps before the window: first compiles and cache fills stay out of the numbers
MAX_STEPS = 10_000  # a window larger than this only makes a trace too big to analyse
MAX_WARMUP = 1_000
DEFAULT_LOGDIR = Path("tpu-agent-profile")


@dataclass
class ProfileOptions:
    """How to capture: the measured window, where to write, and how to run (chip, ranks, eager mode)."""

    steps: int = DEFAULT_STEPS
    warmup: int = DEFAULT_WARMUP
    logdir: Path = field(default_factory=lambda: DEFAULT_LOGDIR)
    chip: str = DEFAULT_CHIP
    nproc: int = 1
    eager_mode: str | None = None  # strict | debug | defer-and-fuse | None (environment default)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    # Also compile the step with libtpu (`tpu-agent estimate`): a second run of the script and a TPU compile, so
    # opt-in; a profile stays within a few percent of a plain run's cost by default.
    tpu_compiler: bool = False

    def check(self) -> None:
        """Refuse a window that measures nothing or cannot be analysed, and an unknown chip."""
        if not 1 <= self.steps <= MAX_STEPS:
            raise TpuAgentError(
                "bad-steps",
                f"--steps must be between 1 and {MAX_STEPS} (got {self.steps})",
                f"measure {DEFAULT_STEPS} steps",
            )
        if not 0 <= self.warmup <= MAX_WARMUP:
            raise TpuAgentError(
                "bad-warmup",
                f"--warmup must be between 0 and {MAX_WARMUP} (got {self.warmup})",
                f"use --warmup {DEFAULT_WARMUP}",
            )
        get_chip(self.chip)
