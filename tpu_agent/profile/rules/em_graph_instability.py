"""EM-4: Fused eager builds different graphs from step to step (each new graph is a new compile)."""

from __future__ import annotations

from collections import Counter

from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import EAGER_MODE, STEPS, DiagnosticRule, by_site, in_window, window_steps
from tpu_agent.runtime import events as ev

FUSED = "DEFER_AND_FUSE"


def _check(model: ProfileModel) -> list[Finding]:
    if model.config.eager_mode != FUSED:
        return []
    rank = model.primary
    steps = window_steps(rank)
    flushes = [e for e in in_window(rank, rank.events) if isinstance(e, ev.Flush)]
    graphs: dict[int, frozenset[str]] = {i: frozenset() for i in steps}
    for flush in flushes:
        if flush.step is not None:
            graphs[flush.step] = graphs[flush.step] | {flush.graph_hash}
    if len(steps) < 2 or not flushes:
        return []
    common, _ = Counter(graphs.values()).most_common(1)[0]
    changed = [i for i in steps if graphs[i] != common]
    if not changed:
        return []
    new_flushes = [f for f in flushes if f.step in changed and f.graph_hash not in common]
    sites = by_site(new_flushes)
    share = len(changed) / len(steps)
    return [
        RULE.finding(
            f"{len(changed)} of {len(steps)} steps built graphs the other steps did not",
            Evidence("steps with new graphs", len(changed), 0, "steps", tuple(changed)),
            [Location.from_site(site) for site in list(sites)[:3]],
            "The same step code should produce the same graphs every step. Look for shapes that change (see SH-1), "
            "Python branches on values, or a different number of ops per step.",
            agent_change=AgentChange(
                "Make the step's code path and tensor shapes identical every step (pad or bucket shapes)."
            ),
            saving_pct=min(share * 50, 50.0),
            confidence=0.6,
            time_ns=new_flushes[0].time_ns if new_flushes else None,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="EM-4",
    name="per-step graph instability",
    category="eager-mode",
    severity=Severity.warning,
    rationale="A graph seen for the first time is compiled before it runs; steady state should reuse cached graphs.",
    before="x = x[: lengths.max()]  # data-dependent slice",
    after="x = x[:, :MAX_LEN]  # fixed shape",
    references=("docs/tpu-performance.md#eager-modes",),
    requires=(STEPS, EAGER_MODE),
    check=_check,
)
