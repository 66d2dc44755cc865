"""EM-2: Fused eager (``DEFER_AND_FUSE``) cut into many small graphs by flushes; names the flush sites."""

from __future__ import annotations

from collections import Counter

from tpu_agent.profile import patches
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import EAGER_MODE, STEPS, DiagnosticRule, by_site, in_window, step_ns, window_steps
from tpu_agent.profile.rules._sync import accumulation_fix
from tpu_agent.runtime import events as ev

FUSED = "DEFER_AND_FUSE"
FLUSHES_THRESHOLD = 5
FLUSH_COST_NS = 50_000  # a graph launch plus the lost fusion across the cut


def _check(model: ProfileModel) -> list[Finding]:
    if model.config.eager_mode != FUSED:
        return []
    rank = model.primary
    steps = window_steps(rank)
    flushes = [e for e in in_window(rank, rank.events) if isinstance(e, ev.Flush) and e.cause != "exit"]
    if not steps:
        return []
    per_step = len(flushes) / len(steps)
    if per_step <= FLUSHES_THRESHOLD:
        return []
    median = step_ns(rank)
    sites = by_site(flushes)
    locations = [
        Location.from_site(site, round(len(items) / len(flushes), 4)) for site, items in list(sites.items())[:5]
    ]
    causes = Counter(e.cause for e in flushes)
    top_site = next(iter(sites), None)
    change = accumulation_fix(top_site) if top_site else None
    described = ", ".join(f"{cause} x{count}" for cause, count in causes.most_common())
    where = ", ".join(f"{patches.display_path(s.file)}:{s.line}" for s in list(sites)[:3])
    return [
        RULE.finding(
            f"DeferAndFuse flushed {per_step:.1f} times per step ({described})",
            Evidence("flushes per step", round(per_step, 2), FLUSHES_THRESHOLD, "per step", tuple(steps)),
            locations,
            f"Each flush ends a fused graph. Remove the host reads at {where or 'the flush sites'} from the step; "
            'then consider torch.compile(backend="tpu") for the whole step.',
            agent_change=change or AgentChange(f"Remove or defer the reads that flush at {where}."),
            saving_pct=min((per_step - 1) * FLUSH_COST_NS / median * 100, 60.0),
            confidence=0.65,
            time_ns=flushes[0].time_ns,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="EM-2",
    name="fused-eager fragmentation",
    category="eager-mode",
    severity=Severity.warning,
    rationale="Every materialisation is a graph break in Fused eager: many flushes mean many small graphs and "
    "launches.",
    before="for x, y in loader:\n    ...\n    total += loss.item()",
    after="for x, y in loader:\n    ...\n    total += loss.detach()",
    references=("docs/tpu-performance.md#eager-modes",),
    requires=(STEPS, EAGER_MODE),
    check=_check,
)
