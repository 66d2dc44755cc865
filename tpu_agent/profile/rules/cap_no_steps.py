"""CAP-1: no step markers, so no per-step view (XProf's overview says "No step time measured")."""

from __future__ import annotations

from tpu_agent.profile.model import Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import DiagnosticRule


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    if rank.steps:
        return []
    location = [Location(model.config.script, 1, "<module>")] if model.config.script else []
    return [
        RULE.finding(
            "No training step was recognised",
            Evidence("steps", 0, 1, "steps"),
            location,
            "No optimizer.step() ran and no step annotation was found. Wrap one iteration of the loop in "
            "`with tpu_agent.profile.step():` so each step can be measured.",
            confidence=0.9,
        )
    ]


RULE = DiagnosticRule(
    code="CAP-1",
    name="no step markers",
    category="capture",
    severity=Severity.error,
    rationale="Every per-step statistic (step time, syncs per step, shapes per step) needs step boundaries.",
    before="for batch in loader:\n    out = model(batch)",
    after="import tpu_agent.profile\nfor batch in loader:\n    with tpu_agent.profile.step():\n        out = "
    "model(batch)",
    references=("docs/tpu-performance.md#capture-validity",),
    requires=(),
    check=_check,
)
