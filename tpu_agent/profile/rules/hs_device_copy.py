"""HS-2: device-to-host copies (``.cpu()``, ``.numpy()``, ``print(tensor)``, ``torch.save``) inside the step."""

from __future__ import annotations

from tpu_agent.profile.model import Finding, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule
from tpu_agent.profile.rules._sync import sync_findings

OPS = frozenset({"cpu", "numpy", "print", "save", "synchronize"})


def _check(model: ProfileModel) -> list[Finding]:
    return sync_findings(RULE, model, OPS, "Device-to-host copy")


RULE = DiagnosticRule(
    code="HS-2",
    name="device-to-host copy in step",
    category="host sync",
    severity=Severity.warning,
    rationale="Copies to the host and printing tensors materialise pending work and wait for the transfer.",
    before="print(f'loss {loss}')",
    after="if step % 100 == 0:\n    print(f'loss {loss.item():.4f}')",
    references=("docs/tpu-performance.md#host-syncs",),
    requires=(STEPS, HOOKS),
    check=_check,
)
