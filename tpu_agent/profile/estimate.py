"""Roofline estimate of the step on a real TPU, from the FLOPs and bytes the captured step moved.

The capture ran on CPU (or the emulated device), so its wall times say nothing about a TPU. What carries
over is the work: FLOPs of every matmul/convolution and bytes every op reads and writes. Each op takes at
least ``max(flops / peak, bytes / bandwidth)`` on the chosen chip (the roofline); summing per op gives
the eager estimate (every op its own kernel, intermediates round-trip HBM), and a fused estimate counts
only the matmuls' traffic (elementwise work fused into them, as torch.compile / DeferAndFuse do).
"""

from __future__ import annotations

from typing import Any

from tpu_agent.estimate.compiler import compiler_status
from tpu_agent.profile.model import Estimate, ProfileModel
from tpu_agent.profile.op_classes import MXU_OPS
from tpu_agent.profile.rules._base import window_steps


def roofline_label() -> str:
    """Says what the figures are: a roofline, and how to get the TPU compiler's own estimate instead."""
    status = compiler_status()
    if status.available:
        return (
            "roofline from the captured ops (libtpu is installed: `profile --tpu-compiler` or `tpu-agent estimate` "
            "adds the TPU compiler's own estimate)"
        )
    return f"roofline from the captured ops, not the TPU compiler ({status.reason}; {status.hint})"


def attach_compiler_estimate(estimate: Estimate, document: dict[str, Any] | None, note: str = "") -> None:
    """Put `tpu-agent estimate`'s result beside the roofline (or say why there is none)."""
    if document is not None:
        estimate.method = "tpu-compiler"
        estimate.compiler = document["estimate"]
    elif note:
        estimate.assumptions.append(f"no TPU compiler estimate: {note}")


def estimate(model: ProfileModel) -> Estimate:
    """Estimate step time and MFU on ``model.config.chip`` from the window's kernels."""
    chip = model.config.chip
    rank = model.primary
    steps = window_steps(rank)
    peak = chip.peak_bf16_flops_per_device
    bandwidth = chip.hbm_bandwidth_per_device
    assumptions = [
        roofline_label(),
        f"{chip.device_name}: peak {peak / 1e12:.0f} TFLOP/s bf16 and {bandwidth / 1e9:.0f} GB/s HBM per device",
        "FLOPs counted for matmuls and convolutions from recorded shapes (2*M*K*N); other ops counted as memory "
        "traffic only",
        "every matmul assumed at bf16 peak (fp32 at XLA default precision); no MXU padding losses (see SH-2)",
        "eager: each op reads its inputs and writes its output through HBM; fused: only matmul traffic remains",
        "host dispatch, input pipeline, collectives and compilation are not included",
        f"per device, rank {rank.rank}, averaged over {len(steps)} measured steps",
    ]
    kernels = [op for op in rank.ops if op.costed and op.step in set(steps)]
    if not steps or not kernels:
        return Estimate(chip=chip.key, available=False, assumptions=["no op trace with shapes in the measured window"])
    n = len(steps)
    flops = sum(op.flops for op in kernels) / n
    total_bytes = sum(op.bytes for op in kernels) / n
    eager = sum(max(op.flops / peak, op.bytes / bandwidth) for op in kernels) / n
    matmul_bytes = sum(op.bytes for op in kernels if op.name in MXU_OPS) / n
    fused = max(flops / peak, matmul_bytes / bandwidth)
    intensity = flops / total_bytes if total_bytes else 0.0
    ridge = peak / bandwidth
    return Estimate(
        chip=chip.key,
        available=True,
        steps=n,
        flops_per_step=flops,
        bytes_per_step=total_bytes,
        arithmetic_intensity=intensity,
        ridge_point=ridge,
        eager_step_s=eager,
        fused_step_s=fused,
        eager_mfu=flops / (eager * peak) if eager else 0.0,
        fused_mfu=flops / (fused * peak) if fused else 0.0,
        bound="compute" if intensity >= ridge else "memory",
        assumptions=assumptions,
    )
