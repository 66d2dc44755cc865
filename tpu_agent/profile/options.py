"""How to profile: the measured window and where and how to run, with the defaults and limits that the CLI
(``tpu-agent profile``) and the MCP server (``tpu_profile``) both take from here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from tpu_agent.chips import DEFAULT_CHIP, TpuTarget, parse_target
from tpu_agent.errors import TpuAgentError

DEFAULT_STEPS = 10  # measured steps: enough for a stable median without a long run
DEFAULT_WARMUP = 2  # steps before the window: first compiles and cache fills stay out of the numbers
MAX_STEPS = 10_000  # a window larger than this only makes a trace too big to analyse
MAX_WARMUP = 1_000
DEFAULT_LOGDIR = Path("tpu-agent-profile")
# Verification of diffs (tpu_agent.profile.verify): each diff is one more short run of the script.
VERIFY_MAX_STEPS = 5  # measured steps of a patched run at most: enough for the rule to see its pattern again
VERIFY_TIMEOUT_S = 180.0  # per diff: a patched run past this is stopped and its diff withheld
VERIFY_CAPTURE_LIMIT_S = 300.0  # a capture longer than this is not verified (each check would cost about as much)
VERIFY_ENV = "TPU_AGENT_PROFILE_VERIFY"  # "0" makes --no-verify the default (a CI that checks diffs elsewhere)


def verify_default() -> bool:
    """Whether diffs are verified when neither ``--verify`` nor ``--no-verify`` is given: yes, unless
    ``TPU_AGENT_PROFILE_VERIFY`` is ``0``/``false``/``off``/``no``."""
    return os.environ.get(VERIFY_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


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
    # Apply each finding's diff to a copy of the script's folder, run it and re-run the rule before offering it.
    verify: bool = field(default_factory=verify_default)
    verify_steps: int = VERIFY_MAX_STEPS
    verify_timeout_s: float = VERIFY_TIMEOUT_S
    verify_capture_limit_s: float = VERIFY_CAPTURE_LIMIT_S
    # End the script once the measured window is over (verification's own runs): only the window is read.
    stop_after_window: bool = False

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
        if not 1 <= self.verify_steps <= MAX_STEPS:
            raise TpuAgentError(
                "bad-verify-steps",
                f"--verify-steps must be between 1 and {MAX_STEPS} (got {self.verify_steps})",
                f"use --verify-steps {VERIFY_MAX_STEPS}",
            )
        if self.verify_timeout_s <= 0:
            raise TpuAgentError(
                "bad-verify-timeout",
                f"--verify-timeout must be positive (got {self.verify_timeout_s})",
                f"use --verify-timeout {VERIFY_TIMEOUT_S:g}",
            )
        self.tpu  # noqa: B018  (parsed here, so that an unknown chip is refused before anything runs)

    @cached_property
    def tpu(self) -> TpuTarget:
        """``chip`` parsed, once per run: the capture, the analysis and the compiler's pass all read this."""
        return parse_target(self.chip)
