"""What an estimate can be asked for: the target, the sharding strategies, the optimizer steps to run, with the
defaults and limits that the CLI (``tpu-agent estimate``), the MCP server (``tpu_estimate``),
:class:`~tpu_agent.estimate.script.EstimateOptions` and the capture hook all take from here.

The steps are *optimizer* steps the script runs before its step is compiled, not the measured window of
``tpu-agent profile`` (:data:`tpu_agent.profile.options.DEFAULT_STEPS`): hence their own names.
"""

from __future__ import annotations

DEFAULT_TARGET = "v5e"  # one v5e chip: the smallest target the compiler lays out
# as-captured: the placements the script's own DDP / FSDP2 / DTensor code gave each tensor; data-parallel:
# parameters on every chip, batch split; fsdp: parameters and optimizer state split too (tpu_agent.estimate.step)
STRATEGIES = ("as-captured", "data-parallel", "fsdp")
# How hard the TPU compiler works at the program's speed (its exec-time optimisation effort): "fast" at its least
# (-1), "full" at its default, as MaxText's train_compile. Memory fitting stays at its default in both, so the HBM
# figures come from the same memory planning; "fast" schedules and fuses less (a 7B Llama step on v6e-8, measured
# under the same load: its programs compiled in 232 s instead of 747 s, its peak HBM 22.50 GiB instead of 21.55).
# Calibration factors are per effort (calibration.py).
EFFORTS = ("fast", "full")
DEFAULT_EFFORT = "fast"
EXEC_TIME_EFFORT = {"fast": -1.0, "full": 0.0}
EFFORT_MEANING = {
    "fast": "the compiler's least scheduling and fusion search; memory planning at its default",
    "full": "the compiler's defaults, as MaxText's train_compile",
}


def efforts_help() -> str:
    """The efforts and what each means, one text for the CLI's help and the MCP tool's argument."""
    meanings = "; ".join(f"{name}: {meaning}" for name, meaning in EFFORT_MEANING.items())
    return f"The TPU compiler's effort at the program's speed ({meanings}). Each has its own calibration."


# The steady step is the interval between the last two optimizer steps, so fewer than two leaves none.
MIN_OPTIMIZER_STEPS = 2
DEFAULT_OPTIMIZER_STEPS = 3  # one more than the minimum: the first step's one-off work stays out of the compiled one
MAX_OPTIMIZER_STEPS = 100  # a longer run only delays the compile, whose step is the same

__all__ = [
    "DEFAULT_EFFORT",
    "DEFAULT_OPTIMIZER_STEPS",
    "DEFAULT_TARGET",
    "EFFORTS",
    "EFFORT_MEANING",
    "EXEC_TIME_EFFORT",
    "MAX_OPTIMIZER_STEPS",
    "MIN_OPTIMIZER_STEPS",
    "STRATEGIES",
    "efforts_help",
]
