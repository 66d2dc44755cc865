"""CAP-3: warm-up (first compiles, cold caches) inside the measured window skews every average."""

from __future__ import annotations

import statistics

from tpu_agent.profile.model import Evidence, Finding, ProfileModel, Severity
from tpu_agent.profile.rules._base import STEPS, DiagnosticRule, in_window
from tpu_agent.runtime import events as ev

RATIO = 3.0
MIN_EXCESS_NS = 50_000_000  # and 50 ms above the median: scheduler noise on a busy host is not warm-up
# and twice the slowest later step: warm-up decays, a random stall in the middle of the window does not


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    window = rank.steps_in_window()
    if len(window) < 2:
        return []
    rest = statistics.median(s.duration_ns for s in window[1:])
    ratio = window[0].duration_ns / rest if rest else 0.0
    first_compiles = [e for e in in_window(rank, rank.events) if isinstance(e, ev.Compile) and not e.is_recompile]
    later_max = max(s.duration_ns for s in window[1:])
    slow_first = (
        ratio > RATIO and window[0].duration_ns - rest > MIN_EXCESS_NS and window[0].duration_ns > 2 * later_max
    )
    if not slow_first and not first_compiles:
        return []
    extra = (model.config.requested_warmup or 0) + 1
    return [
        RULE.finding(
            f"Step {window[0].index} is {ratio:.1f}x the median step: warm-up is inside the window",
            Evidence("first step / median step", round(ratio, 2), RATIO, "x", (window[0].index,)),
            [],
            f"Start measuring later: `tpu-agent profile --warmup {extra} ...`. The first steps compile graphs and fill "
            "caches; they are not representative.",
            confidence=0.8,
            time_ns=window[0].start_ns,
        )
    ]


RULE = DiagnosticRule(
    code="CAP-3",
    name="warm-up inside the window",
    category="capture",
    severity=Severity.warning,
    rationale="Compilation and cache fills make the first steps slow; averaging them in misleads every rule.",
    before="tpu-agent profile --warmup 0 train.py",
    after="tpu-agent profile --warmup 3 train.py",
    references=("docs/tpu-performance.md#capture-validity",),
    requires=(STEPS,),
    check=_check,
)
