"""From the compiler's optimal step time to one with an error band, calibrated against published TPU runs.

libtpu's ``optimal_seconds`` (or the roofline of its FLOPs and bytes) assumes every unit busy all the time
within a program, which alone would make it a lower bound; but the estimate sums its programs with no overlap
between them and counts the flash kernel's masked tiles, and the runs measured here took less than the
estimate (see ``CALIBRATIONS``). Only a measured ratio says which way a step errs. The
published runs below were measured on hardware; ``benchmarks/estimate_calibration.py`` captures the same
shapes here on meta storage and compiles them, and the ratio of measured to estimated time per run is the
data the factor comes from. One table holds the runs and one function applies the factor, so a new
published run is one record and a new benchmark result one number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpu_agent.estimate.options import EFFORTS


@dataclass(frozen=True)
class PublishedRun:
    """A training step measured on TPU hardware and published, with the shapes that reproduce it here.

    ``script_args`` are arguments of ``tests/estimate/scripts/llama_fsdp_train.py`` (a user-style PyTorch
    script) that build the same model, per-chip batch and sequence; ``outcome`` is what the hardware did:
    ``"ran"`` with its step time, or the compiler's refusal (``"CompileTimeHbmOom"``). ``estimated_seconds`` are
    the uncalibrated step times the benchmark measured for it, by compile effort (``options.EFFORTS``)."""

    name: str
    source: str
    target: str
    script_args: tuple[str, ...]
    outcome: str
    measured_seconds: float | None = None
    measured_tflops_per_chip: float | None = None
    estimated_seconds: Mapping[str, float] = field(default_factory=dict)


# MaxText recomputes (remat), keeps its logits' loss in tiles and its weights in float32 while it computes in bf16
# (weight_dtype, dtype); the script checkpoints layers and loss chunks and uses FSDP2's mixed precision
_LLAMA31_8B = (
    "--preset",
    "8b",
    "--dtype",
    "float32",
    "--compute-dtype",
    "bfloat16",
    "--seq",
    "8192",
    "--checkpointing",
    "--loss-chunks",
    "8",
)
_RECIPES = "https://github.com/AI-Hypercomputer/tpu-recipes/blob/main/training/trillium/Llama3.1-8B-MaxText"
PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    PublishedRun(
        name="MaxText Llama3.1-8B, v6e-8, 3 x 8192 tokens per chip, FSDP",
        source=f"{_RECIPES}/v6e-8/README.md",
        target="v6e-8",
        script_args=(*_LLAMA31_8B, "--batch", "24"),
        outcome="ran",
        measured_seconds=3.443,
        measured_tflops_per_chip=413.433,
        estimated_seconds={"fast": 5.279, "full": 4.294},  # benchmarks/estimate_calibration.py, libtpu 0.0.42.1
    ),
    PublishedRun(
        name="MaxText Llama3.1-8B, v6e-16, 3 x 8192 tokens per chip, FSDP",
        source=f"{_RECIPES}/v6e-16/README.md",
        target="v6e-16",
        script_args=(*_LLAMA31_8B, "--batch", "48"),
        outcome="ran",
        measured_seconds=3.393,
        measured_tflops_per_chip=419.485,
        estimated_seconds={"fast": 6.897, "full": 6.192},
    ),
    PublishedRun(
        name="MaxText Llama3.1-8B, v6e-4, default settings (3 x 8192 per chip)",
        source=f"{_RECIPES}/v6e-8/README.md",
        target="v6e-4",
        script_args=(*_LLAMA31_8B, "--batch", "12"),
        outcome="CompileTimeHbmOom",
    ),
)


@dataclass(frozen=True)
class Calibration:
    """Measured over estimated step time for one kind of program, from the published runs named."""

    kind: str
    factor: float  # the central ratio: calibrated time = estimated time x factor
    low: float  # the smallest and largest ratio over the runs: the error band's ends
    high: float
    runs: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "factor": self.factor, "low": self.low, "high": self.high, "runs": list(self.runs)}


def calibration_from_runs(kind: str, runs: tuple[PublishedRun, ...], effort: str) -> Calibration | None:
    """The factor and band over the runs that ran and have an estimate at ``effort``: the geometric mean of
    measured over estimated, and the smallest and largest ratio (with few runs this is their spread, not a
    statistical interval, and the report says how many runs it rests on)."""
    used = [
        (run.name, run.measured_seconds / run.estimated_seconds[effort])
        for run in runs
        if run.measured_seconds and run.estimated_seconds.get(effort, 0) > 0
    ]
    if not used:
        return None
    names = tuple(name for name, _ in used)  # the runs the ratios came from, and no other
    ratios = [ratio for _, ratio in used]
    product = 1.0
    for ratio in ratios:
        product *= ratio
    return Calibration(kind, product ** (1 / len(ratios)), min(ratios), max(ratios), names)


# A whole training step compiled as XLA programs (what the estimate compiles): MaxText's jitted steps measure it.
# DeferAndFuse's host work between graphs is not in any published run here, so it is not calibrated.
# Measured: benchmarks/estimate_calibration.py (libtpu 0.0.42.1) captured each run on meta storage and compiled
# every program of its step, at the default effort ("fast"). v6e-8: none refused, "fits" (20.19 GiB peak per
# chip), 5.279 s against the 3.443 s measured on hardware (0.65); v6e-16: "fits" (14.39 GiB), 6.897 s against
# 3.393 s (0.49): a factor of 0.57, band 0.49 to 0.65. v6e-4: "does not fit" (the AdamW update refused at 32.08
# GiB: the float32 weights, gradients and moments alone are 30.6 GiB a chip), as the hardware's CompileTimeHbmOom.
# The estimate is above the measured time, not below it: its programs' times are summed with no overlap between
# them, the flash kernel's FLOPs are the full causal score matrix's (a kernel that skips masked tiles, as
# MaxText's splash attention does, does about half), and the chunked loss's programs, which libtpu gives no time
# for, are timed by their roofline with their collectives' bytes as HBM traffic (the v6e-16 step's loss chunks
# come out twice v6e-8's: the wider band). At "full" effort: v6e-8 "fits" (20.98 GiB), 4.294 s (0.80); v6e-16
# "fits" (15.16 GiB), 6.192 s (0.55): a factor of 0.66, band 0.55 to 0.80.
CALIBRATION_KIND = "compiled XLA training step (MaxText on v6e)"
CALIBRATIONS = {
    effort: calibration_from_runs(f"{CALIBRATION_KIND}, compiled at {effort} effort", PUBLISHED_RUNS, effort)
    for effort in EFFORTS
}


def calibrated_time(
    step_seconds: float, model_flops: float, chips: int, peak_flops_per_chip: float, effort: str
) -> dict[str, Any] | None:
    """The calibrated step time, its band and the MFU at that time, with the calibration's source, for
    ``--format json`` (documented in docs/estimate-json-schema.md); None without a step time or without a
    calibration at the ``effort`` the step was compiled with (each effort times programs its own way)."""
    calibration = CALIBRATIONS.get(effort)
    if calibration is None or step_seconds <= 0:
        return None
    seconds = step_seconds * calibration.factor
    return {
        "seconds": seconds,
        "low_seconds": step_seconds * calibration.low,
        "high_seconds": step_seconds * calibration.high,
        "mfu": min(1.0, model_flops / (seconds * peak_flops_per_chip * chips)) if model_flops > 0 else None,
        "calibration": calibration.to_dict(),
        "sources": [run.source for run in PUBLISHED_RUNS if run.name in calibration.runs],
        "note": EAGER_NOTE,
    }


EAGER_NOTE = (
    "measured on compiled whole-step programs; TorchTPU's eager modes (DeferAndFuse, Strict) add host dispatch "
    "between graphs that no published run here measures, so for them the calibrated time is unverified"
)
