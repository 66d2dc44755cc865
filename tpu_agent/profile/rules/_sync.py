"""Shared by HS-1 and HS-2: host syncs per call site, and the local fix for scalar accumulation."""

from __future__ import annotations

import ast

from tpu_agent.profile import patches, sources
from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, ProfileModel, Severity
from tpu_agent.profile.rules._base import DiagnosticRule, Insufficient, by_site, in_window, step_ns, window_steps
from tpu_agent.runtime import events as ev

# A device-to-host read drains the TorchTPU queue: the host waits for every pending op, then the device idles
# until the host dispatches again. 100 µs per sync is the assumed round-trip cost on a TPU VM.
SYNC_COST_NS = 100_000
PER_STEP_THRESHOLD = 0.5
ERROR_SAVING_PCT = 30.0
ACCUMULATE = r"(\+=\s*.*?)\.item\(\)"


def accumulation_fix(site: ev.Site) -> AgentChange | None:
    """``total += loss.item()`` -> ``total += loss.detach()``: the sum stays on the device, read once later."""
    diff = patches.replace_on_line(site.file, site.line, ACCUMULATE, r"\1.detach()")
    if diff is None:
        return None
    return AgentChange(
        "Accumulate on the device instead of reading a Python float every step; convert once after the loop "
        "(e.g. `float(total)` where the total is printed).",
        diff,
    )


EVERY_N_STEPS = 10


def _loop_counter(path: str, line: int) -> str | None:
    """The step counter of the loop around ``line``: ``step`` in ``for step in range(...)`` or ``for step, batch in
    enumerate(...)``; ``None`` without one (a ``for batch in loader`` has no counter to test)."""
    tree = sources.parse_source(path)
    if tree is None:
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and node.lineno < line <= (node.end_lineno or node.lineno):
            if found is None or node.lineno > found.lineno:
                found = node
    if found is None or not isinstance(found.iter, ast.Call):
        return None
    callee = sources.dotted_name(found.iter.func)
    target = found.target
    if callee == "range" and isinstance(target, ast.Name):
        return target.id
    if callee == "enumerate" and isinstance(target, ast.Tuple) and isinstance(target.elts[0], ast.Name):
        return target.elts[0].id
    return None


def periodic_fix(site: ev.Site, kinds: list[str]) -> AgentChange | None:
    """A read whose value is only shown or logged (an expression statement: ``print(loss)``,
    ``history.append(loss.cpu())``) runs every :data:`EVERY_N_STEPS` steps: ``if step % 10 == 0:`` around it.
    An assignment is left alone: a value used later must not go stale."""
    tree = sources.parse_source(site.file)
    counter = _loop_counter(site.file, site.line)
    if tree is None or counter is None:
        return None
    statement = next(
        (n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno == site.line == n.end_lineno), None
    )
    if not isinstance(statement, ast.Expr):
        return None
    diff = patches.wrap_line(site.file, site.line, f"if {counter} % {EVERY_N_STEPS} == 0:")
    if diff is None:
        return None
    return AgentChange(
        f"Run the `{'/'.join(kinds)}` read at line {site.line} every {EVERY_N_STEPS} steps instead of every step "
        "(the value stays on the device in between).",
        diff,
    )


def sync_findings(rule: DiagnosticRule, model: ProfileModel, ops: frozenset[str], what: str) -> list[Finding]:
    rank = model.primary
    steps = window_steps(rank)
    if not steps:
        raise Insufficient("no complete step inside the measured window")
    median = step_ns(rank)
    syncs = [e for e in in_window(rank, rank.events) if isinstance(e, ev.HostSync) and e.op in ops]
    findings = []
    for site, events in by_site(syncs).items():
        per_step = len(events) / len(steps)
        if per_step < PER_STEP_THRESHOLD:
            continue
        saving = min(per_step * SYNC_COST_NS / median * 100, 60.0)
        kinds = sorted({e.op for e in events})
        change = accumulation_fix(site) if "item" in kinds else None
        change = change or periodic_fix(site, kinds)
        if change is None:
            change = AgentChange(
                f"Move the `{'/'.join(kinds)}` call at {patches.display_path(site.file)}:{site.line} out of the step, "
                "or "
                "run it every N steps (`if step % 100 == 0:`); keep the value as a tensor until then."
            )
        code = patches.line_text(site.file, site.line)
        findings.append(
            rule.finding(
                f"{what} `{'/'.join(kinds)}` {per_step:.1f}x per step at {patches.display_path(site.file)}:{site.line}"
                + (f": {code}" if code else ""),
                Evidence(
                    "host syncs per step",
                    round(per_step, 2),
                    PER_STEP_THRESHOLD,
                    "per step",
                    tuple(sorted({e.step for e in events if e.step is not None})),
                ),
                [Location.from_site(site, share_of_step=round(saving / 100, 4))],
                "Each read waits for all queued TPU work and leaves the TPU idle until the host catches up; in "
                "DeferAndFuse it also cuts the fused graph. Keep values on the device and read them rarely.",
                severity=Severity.error if saving >= ERROR_SAVING_PCT else rule.severity,
                agent_change=change,
                saving_pct=saving,
                confidence=0.75,
                time_ns=events[0].time_ns,
                rank=rank.rank,
            )
        )
    return findings
