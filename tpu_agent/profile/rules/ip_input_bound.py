"""IP-1: the step waits for the DataLoader (input-bound)."""

from __future__ import annotations

from tpu_agent.profile import patches
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import HOOKS, STEPS, DiagnosticRule, share, step_ns, window_steps

WARNING_SHARE = 0.05  # XProf: 5-20 % moderately input-bound
ERROR_SHARE = 0.20  # >= 20 % highly input-bound


def _check(model: ProfileModel) -> list[Finding]:
    rank = model.primary
    steps = set(window_steps(rank))
    waits = [w for w in rank.data_waits if w.step in steps]
    if not waits:
        return []
    wait_share = share(sum(w.duration_ns for w in waits) / len(steps), step_ns(rank))
    if wait_share < WARNING_SHARE:
        return []
    locations = []
    change = AgentChange("Load batches in background workers: num_workers>0, persistent_workers=True, prefetch_factor.")
    for loader in rank.dataloaders:
        if loader.site is None:
            continue
        locations.append(Location.from_site(loader.site))
        workers = max(4, loader.num_workers * 2)
        kwargs = {"num_workers": str(workers), "persistent_workers": "True"}
        if loader.num_workers:
            kwargs["prefetch_factor"] = "4"
        diff = patches.add_call_kwargs(loader.site.file, loader.site.line, "DataLoader", kwargs)
        if diff:
            change = AgentChange(f"Give the DataLoader {workers} worker processes that stay alive across epochs.", diff)
            break
    if waits[0].site:
        locations.append(Location.from_site(waits[0].site, round(wait_share, 4)))
    return [
        RULE.finding(
            f"The step waits for data {wait_share:.0%} of the time",
            Evidence(
                "DataLoader wait share of step", round(wait_share, 3), WARNING_SHARE, "fraction", tuple(sorted(steps))
            ),
            locations,
            "The TPU idles while the host loads the next batch. Use DataLoader worker processes (num_workers), keep "
            "them "
            "alive (persistent_workers), prefetch, and move heavy preprocessing offline.",
            severity=Severity.error if wait_share >= ERROR_SHARE else Severity.warning,
            agent_change=change,
            saving_pct=wait_share * 100,
            confidence=0.8,
            time_ns=waits[0].time_ns,
            rank=rank.rank,
        )
    ]


RULE = DiagnosticRule(
    code="IP-1",
    name="input-bound",
    category="input pipeline",
    severity=Severity.warning,
    rationale="Time in DataLoader.__next__ inside the step is time the TPU has nothing to do.",
    before="DataLoader(ds, batch_size=64)",
    after="DataLoader(ds, batch_size=64, num_workers=4, persistent_workers=True)",
    references=(
        "docs/tpu-performance.md#input-pipeline",
        "https://pytorch.org/docs/stable/data.html",
    ),
    requires=(STEPS, HOOKS),
    check=_check,
)
