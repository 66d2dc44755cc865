"""SD-6: ``nn.DataParallel`` (single-process, multi-device) where DDP or FSDP over ``tpu_dist`` belongs."""

from __future__ import annotations

from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, DiagnosticRule

WRAPPER = "DataParallel"


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    if WRAPPER not in rank.module_types:
        return []
    return [
        RULE.finding(
            "The model runs under nn.DataParallel",
            Evidence("DataParallel wrappers", rank.module_types.count(WRAPPER), 0, "modules"),
            [Location.from_site(rank.forward_site)] if rank.forward_site else [],
            "DataParallel drives all devices from one Python thread and copies the model every step. Use one process "
            "per device (`tpu-agent run --nproc N`) with DistributedDataParallel, or FSDP2 fully_shard for large "
            "models.",
            agent_change=AgentChange(
                "Replace `nn.DataParallel(model)` with `DistributedDataParallel(model)` after "
                '`dist.init_process_group("tpu_dist")`, and launch with `tpu-agent run --nproc N`.'
            ),
            saving_pct=20.0,
            confidence=0.8,
        )
    ]


RULE = DiagnosticRule(
    code="SD-6",
    name="DataParallel instead of DDP/FSDP",
    category="sharding",
    severity=Severity.warning,
    rationale="Single-process multi-device replication is slow and unsupported by TorchTPU's distributed stack.",
    before="model = nn.DataParallel(model)",
    after='dist.init_process_group("tpu_dist")\nmodel = DistributedDataParallel(model)',
    references=(
        "docs/tpu-performance.md#sharding-and-memory",
        "https://pytorch.org/docs/stable/notes/ddp.html",
    ),
    requires=(HOOKS,),
    check=_check,
)
