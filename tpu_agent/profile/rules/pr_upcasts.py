"""PR-2: needless up-casts from bf16/fp16 to fp32 inside the step."""

from __future__ import annotations

from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import OP_TRACE, STEPS, DiagnosticRule, share, window_steps

CAST_OPS = frozenset({"aten::_to_copy", "aten::to"})
LOW_PRECISION = frozenset({"c10::BFloat16", "c10::Half"})
FLOAT32 = "6"  # c10::ScalarType::Float, as torch.profiler records the dtype argument
BYTES_SHARE_THRESHOLD = 0.10


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    steps = set(window_steps(rank))
    kernels = [op for op in rank.ops if op.costed and op.step in steps]
    total = sum(op.bytes for op in kernels)
    upcasts = [
        op
        for op in kernels
        if op.name in CAST_OPS
        and op.input_dtypes[:1]
        and op.input_dtypes[0] in LOW_PRECISION
        and len(op.concrete_inputs) > 1
        and op.concrete_inputs[1] == FLOAT32
    ]
    moved = sum(op.bytes for op in upcasts)
    if not total or moved / total < BYTES_SHARE_THRESHOLD:
        return []
    bytes_share = share(moved, total)
    return [
        RULE.finding(
            f"{len(upcasts)} bf16/fp16 -> fp32 up-casts move {bytes_share:.0%} of the step's bytes",
            Evidence(
                "up-cast share of bytes", round(bytes_share, 3), BYTES_SHARE_THRESHOLD, "fraction", tuple(sorted(steps))
            ),
            [Location.from_site(rank.forward_site)] if rank.forward_site else [],
            "Reduce in the native dtype where accuracy allows (e.g. `x.sum(dtype=x.dtype)`, softmax under autocast) "
            "instead of `.float()` on large activations.",
            agent_change=AgentChange("Remove `.float()` / `.to(torch.float32)` on activations in the model's forward."),
            saving_pct=bytes_share * 50,
            confidence=0.4,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="PR-2",
    name="needless up-casts",
    category="precision",
    severity=Severity.warning,
    rationale="Casting large bf16 activations to fp32 doubles their HBM traffic and often is not needed.",
    before="probs = logits.float().softmax(-1)",
    after="probs = logits.softmax(-1)",
    references=("docs/tpu-performance.md#precision",),
    requires=(STEPS, OP_TRACE),
    check=_check,
)
