"""PR-1: matmuls running in fp32 where bf16 (autocast) would do."""

from __future__ import annotations

import math

from tpu_agent.profile import patches
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import (
    HOOKS,
    MATMUL_OPS,
    OP_TRACE,
    STEPS,
    DiagnosticRule,
    matmul_time_share,
    window_steps,
)

FP32_SHARE_THRESHOLD = 0.5
# An fp32 matmul at full precision takes several bf16 MXU passes and twice the HBM traffic; 3x is the assumption.
FP32_SLOWDOWN = 3.0
AUTOCAST = 'torch.autocast("tpu", dtype=torch.bfloat16)'


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    steps = set(window_steps(rank))
    matmuls = [op for op in rank.ops if op.costed and op.step in steps and op.name in MATMUL_OPS and op.flops]
    total = sum(op.flops for op in matmuls)
    if not total:
        return []
    fp32 = sum(op.flops for op in matmuls if next((t for t in op.input_dtypes if t), "") == "float")
    fp32_share = fp32 / total
    if fp32_share < FP32_SHARE_THRESHOLD:
        return []
    saving = matmul_time_share(rank) * fp32_share * (1 - 1 / FP32_SLOWDOWN) * 100
    locations = []
    diff = None
    if rank.forward_site:
        locations.append(Location.from_site(rank.forward_site, round(saving / 100, 4)))
        diff = patches.wrap_line_in_with(rank.forward_site.file, rank.forward_site.line, AUTOCAST)
    fp32_weights = sorted(
        (w for w in rank.weights if w.dtype == "float32" and w.site), key=lambda w: -math.prod(w.shape)
    )
    locations.extend(Location.from_site(w.site) for w in fp32_weights[:3] if w.site)
    return [
        RULE.finding(
            f"{fp32_share:.0%} of matmul FLOPs run in fp32",
            Evidence("fp32 share of matmul FLOPs", round(fp32_share, 3), FP32_SHARE_THRESHOLD, "fraction"),
            locations,
            'TPUs compute natively in bf16. Run the forward pass under autocast("tpu", dtype=torch.bfloat16); keep '
            "fp32 master weights and optimizer state (no GradScaler is needed with bf16).",
            agent_change=AgentChange(f"Run the model's forward (and loss) under `with {AUTOCAST}:`.", diff),
            saving_pct=saving,
            confidence=0.6,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    id="PR-1",
    name="fp32 matmuls",
    category="precision",
    severity=Severity.warning,
    rationale="fp32 matmuls need several bf16 MXU passes and move twice the bytes of bf16.",
    before="loss = loss_fn(model(x), y)",
    after='with torch.autocast("tpu", dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)',
    reference="docs/tpu-performance.md#precision; https://cloud.google.com/tpu/docs/bfloat16",
    requires=(STEPS, OP_TRACE, HOOKS),
    check=_check,
)
