"""SH-3: per-device batch size that is not a multiple of 8 (TPU tiles are 8 x 128)."""

from __future__ import annotations

from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, DiagnosticRule

MULTIPLE = 8


def _check(model: ProfileModel) -> list[Finding]:
    findings = []
    for loader in model.primary.dataloaders:
        batch = loader.batch_size
        if not batch or batch % MULTIPLE == 0:
            continue
        better = max(MULTIPLE, round(batch / MULTIPLE) * MULTIPLE)
        findings.append(
            RULE.finding(
                f"Batch size {batch} is not a multiple of {MULTIPLE}",
                Evidence("batch size", batch, MULTIPLE, "samples"),
                [Location.from_site(loader.site)] if loader.site else [],
                f"Use a per-device batch that is a multiple of {MULTIPLE} (e.g. {better}; 128 or more keeps the MXU "
                "busy) "
                "and scale the learning rate with it.",
                severity=Severity.info,
                agent_change=AgentChange(f"Set batch_size={better} (or another multiple of {MULTIPLE})."),
                saving_pct=0.0,
                confidence=0.5,
            )
        )
    return findings


RULE = DiagnosticRule(
    code="SH-3",
    name="batch size not TPU friendly",
    category="shapes",
    severity=Severity.info,
    rationale="Batch dims are padded to 8 rows per tile; odd batches waste rows and small ones starve the MXU.",
    before="DataLoader(ds, batch_size=30)",
    after="DataLoader(ds, batch_size=32)",
    references=(
        "docs/tpu-performance.md#shapes",
        "https://cloud.google.com/tpu/docs/performance-guide",
    ),
    requires=(HOOKS,),
    check=_check,
)
