"""EM-1: Strict eager (``DEFER_NEVER``) dispatching many small ops per step, one TPU execution each."""

from __future__ import annotations

from tpu_agent.profile import patches
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import EAGER_MODE, STEPS, DiagnosticRule, Insufficient, ops_per_step, step_ns
from tpu_agent.runtime import events as ev

STRICT = "DEFER_NEVER"
OPS_THRESHOLD = 200
# Host dispatch + per-op launch on Strict eager, saved when ops fuse (documented 2.3x on TorchTPU's own benchmark).
PER_OP_OVERHEAD_NS = 10_000
SET_FUSED = "torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE"


def _check(model: ProfileModel) -> list[Finding]:
    if model.config.eager_mode != STRICT:
        return []
    rank = model.primary
    count = ops_per_step(rank)
    if not count:
        raise Insufficient("no op counts per step (no op trace and no runtime op batches)")
    if count < OPS_THRESHOLD or any(isinstance(e, ev.Compile) for e in rank.events):
        return []
    median = step_ns(rank)
    saving = min(count * PER_OP_OVERHEAD_NS / median * 100, 60.0)
    site = rank.step_site
    diff = patches.insert_after_torch_import(site.file, SET_FUSED) if site else None
    return [
        RULE.finding(
            f"Strict eager dispatches {count:.0f} ops per step, each its own TPU execution",
            Evidence("ops per step", count, OPS_THRESHOLD, "ops", tuple(s.index for s in rank.steps_in_window())),
            [Location.from_site(site)] if site else [],
            "Switch to Fused eager (DeferAndFuse) so XLA fuses the step's ops into a few executions; then wrap the "
            'training step in torch.compile(backend="tpu") for one graph per step.',
            agent_change=AgentChange(
                f"Set `{SET_FUSED}` right after `import torch` (or export TORCH_TPU_DEFER_AND_FUSE=1); next, compile "
                "the step.",
                diff,
            ),
            saving_pct=saving,
            confidence=0.6,
            time_ns=rank.steps_in_window()[0].start_ns if rank.steps_in_window() else None,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="EM-1",
    name="strict eager dispatch overhead",
    category="eager-mode",
    severity=Severity.warning,
    rationale="Strict eager compiles and launches every op on its own: no fusion, and host dispatch bounds the step.",
    before="import torch",
    after="import torch\n" + SET_FUSED,
    references=("docs/tpu-performance.md#eager-modes",),
    requires=(STEPS, EAGER_MODE),
    check=_check,
)
