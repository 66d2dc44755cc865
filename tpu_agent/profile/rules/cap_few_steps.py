"""CAP-2: too few complete steps inside the measured window to trust the statistics."""

from __future__ import annotations

from tpu_agent.profile.model import Evidence, Finding, ProfileModel, Severity
from tpu_agent.profile.rules._base import STEPS, DiagnosticRule

MIN_STEPS = 3


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    window = rank.steps_in_window()
    if len(window) >= MIN_STEPS:
        return []
    return [
        RULE.finding(
            f"Only {len(window)} complete step(s) in the measured window",
            Evidence("complete steps in window", len(window), MIN_STEPS, "steps", tuple(s.index for s in window)),
            [],
            f"The script ran {len(rank.steps)} step(s) in total. Profile at least {MIN_STEPS} steady-state steps: "
            "lower --warmup, or give the script more data or iterations.",
            confidence=0.9,
        )
    ]


RULE = DiagnosticRule(
    code="CAP-2",
    name="too few steps",
    category="capture",
    severity=Severity.warning,
    rationale="One or two steps cannot separate steady state from noise; medians need several.",
    before="tpu-agent profile --warmup 5 --steps 2 train.py",
    after="tpu-agent profile --warmup 2 --steps 10 train.py",
    references=("docs/tpu-performance.md#capture-validity",),
    requires=(STEPS,),
    check=_check,
)
