"""SD-2: time in collectives per step (all-reduce, all-gather, ...) on any rank."""

from __future__ import annotations

from collections import Counter

from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, by_site, in_window, share, window_steps
from tpu_agent.runtime import events as ev

SHARE_THRESHOLD = 0.30  # XProf CollectiveBound
NO_DIFF = (
    "a larger batch changes the losses, which a verified diff must keep; overlap (bucketed all-reduce, FSDP "
    "prefetch) is a property of the interconnect's schedule, which the runtime's collectives, run on the host, do "
    "not time as a TPU slice would, so its measure could not show the gain"
)


def _check(model: ProfileModel) -> list[Finding]:
    worst: tuple[float, int, list[ev.Collective]] | None = None
    for rank in model.ranks.values():
        steps = window_steps(rank)
        median = rank.median_step_ns()
        collectives = [e for e in in_window(rank, rank.events) if isinstance(e, ev.Collective)]
        if not steps or not median or not collectives:
            continue
        collective_share = share(sum(e.duration_ns for e in collectives) / len(steps), median)
        if worst is None or collective_share > worst[0]:
            worst = (collective_share, rank.rank, collectives)
    if worst is None or worst[0] < SHARE_THRESHOLD:
        return []
    collective_share, rank_id, collectives = worst
    ops = Counter(e.op for e in collectives)
    return [
        RULE.finding(
            f"Rank {rank_id} spends {collective_share:.0%} of each step in collectives "
            f"({', '.join(f'{o} x{c}' for o, c in ops.most_common(3))})",
            Evidence("collective share of step", round(collective_share, 3), SHARE_THRESHOLD, "fraction"),
            [Location.from_site(site) for site in list(by_site(collectives))[:3]],
            "Overlap communication with compute (bucketed/async all-reduce, FSDP prefetch), raise the per-device "
            "batch, "
            "or rebalance the mesh so less data crosses devices each step.",
            agent_change=AgentChange(
                "Increase the per-device batch or enable FSDP prefetch so collectives overlap compute.",
                no_diff_reason=NO_DIFF,
            ),
            saving_pct=collective_share * 50,
            confidence=0.6,
            time_ns=collectives[0].time_ns,
            rank=rank_id,
        )
    ]


RULE = DiagnosticRule(
    code="SD-2",
    name="collective-bound",
    category="sharding",
    severity=Severity.warning,
    rationale="Collectives that do not overlap compute leave the MXUs idle for their whole duration.",
    before="dist.all_reduce(grad)  # per parameter, after backward",
    after="DDP/FSDP bucketed, overlapped gradient reduction",
    references=("docs/tpu-performance.md#sharding-and-memory",),
    requires=(STEPS, HOOKS),
    check=_check,
)
