"""HS-1: scalar reads (``.item()``, ``.tolist()``, ``bool(t)``, ``float(t)``) inside the step."""

from __future__ import annotations

from tpu_agent.profile.model import Finding, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule
from tpu_agent.profile.rules._sync import sync_findings

OPS = frozenset({"item", "tolist", "bool", "float", "int"})


def _check(model: ProfileModel) -> list[Finding]:
    return sync_findings(RULE, model, OPS, "Scalar read")


RULE = DiagnosticRule(
    code="HS-1",
    name="scalar read in step",
    category="host sync",
    severity=Severity.warning,
    rationale="A scalar read blocks the host until the TPU finishes all queued work, serialising host and device.",
    before="total += loss.item()",
    after="total += loss.detach()  # read float(total) once, after the loop",
    references=(
        "docs/tpu-performance.md#host-syncs",
        "https://cloud.google.com/tpu/docs/performance-guide",
    ),
    requires=(STEPS, HOOKS),
    check=_check,
)
