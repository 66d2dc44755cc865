"""What a diagnostic rule is (data plus one check function) and the metrics several rules share."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from tpu_agent.profile.model import (
    AgentChange,
    Evidence,
    Finding,
    Location,
    Op,
    ProfileModel,
    RankProfile,
    Severity,
)
from tpu_agent.profile.op_classes import MXU_OPS
from tpu_agent.runtime import events as ev

EventT = TypeVar("EventT", bound=ev.Event)

# Data a rule may need; the engine reports INSUFFICIENT_DATA when any is missing.
STEPS = "steps"  # at least one complete step
OP_TRACE = "op_trace"  # host ops with shapes (torch.profiler)
HOOKS = "hooks"  # our in-process capture: call sites, DataLoader, weights, memory, env
EAGER_MODE = "eager_mode"  # the TorchTPU eager mode in force (runtime RunInfo or --eager-mode)
MEMORY = "memory"  # parameter / gradient / optimizer-state bytes
COMPILED = "compiled"  # the step compiled for a TPU by libtpu (`tpu-agent estimate`)


# What a diagnostic is about.
CATEGORIES = ("capture", "host sync", "eager-mode", "compile", "shapes", "precision", "input pipeline", "sharding")


class Insufficient(Exception):
    """Raised by a check that found its inputs present but unusable (e.g. zero steps in the window)."""


@dataclass(frozen=True, kw_only=True)
class DiagnosticRule:
    """One diagnostic: stable code, what it looks for, why it matters, and the check itself. Its fields are named as
    the migration rules' (:class:`tpu_agent.migrate.model.Rule`): ``code`` and ``references``."""

    code: str  # stable, e.g. "HS-1"; never reused once published
    name: str
    category: str  # one of CATEGORIES
    severity: Severity  # the usual severity; a check may raise or lower it with the evidence
    rationale: str
    before: str
    after: str
    # where to read more: public URLs and sections of docs/ shipped with tpu-agent (docs/tpu-performance.md#...)
    references: tuple[str, ...]
    requires: tuple[str, ...]
    check: Callable[[ProfileModel], list[Finding]]

    @property
    def reference(self) -> str:
        """The references as one line (what the text report and ``tpu-agent rules CODE`` print)."""
        return "; ".join(self.references)

    def to_dict(self) -> dict[str, object]:
        """The record as ``tpu-agent rules --format json`` shows it (keys shared with the migration rules)."""
        return {
            "code": self.code,
            "name": self.name,
            "category": self.category,
            "severity": self.severity.value,
            "rationale": self.rationale,
            "before": self.before,
            "after": self.after,
            "reference": self.reference,
            "references": list(self.references),
            "requires": list(self.requires),
        }

    def finding(
        self,
        title: str,
        evidence: Evidence,
        locations: Iterable[Location],
        suggestion: str,
        *,
        severity: Severity | None = None,
        agent_change: AgentChange | None = None,
        saving_pct: float = 0.0,
        confidence: float = 0.7,
        time_ns: int | None = None,
        rank: int | None = None,
    ) -> Finding:
        return Finding(
            rule_id=self.code,
            name=self.name,
            category=self.category,
            severity=severity or self.severity,
            title=title,
            evidence=evidence,
            locations=list(locations),
            suggestion=suggestion,
            agent_change=agent_change,
            estimated_saving_pct=round(max(0.0, min(saving_pct, 100.0)), 2),
            confidence=confidence,
            time_ns=time_ns,
            rank=rank,
        )


def available(model: ProfileModel) -> set[str]:
    """Which kinds of data this capture holds."""
    rank = model.primary
    have: set[str] = set()
    if rank.steps:
        have.add(STEPS)
    if rank.has_op_trace and any(op.input_shapes for op in rank.ops):
        have.add(OP_TRACE)
    if model.config.source == "tpu-agent":
        have.add(HOOKS)
    if model.config.eager_mode:
        have.add(EAGER_MODE)
    if rank.memory is not None:
        have.add(MEMORY)
    if model.compiled is not None:
        have.add(COMPILED)
    return have


def window_steps(rank: RankProfile) -> list[int]:
    """Indices of the steps inside the measured window."""
    return [s.index for s in rank.steps_in_window()]


def step_ns(rank: RankProfile) -> float:
    """Median step time in the window; :class:`Insufficient` when there is none."""
    median = rank.median_step_ns()
    if not median:
        raise Insufficient("no complete step inside the measured window")
    return median


def in_window(rank: RankProfile, events: Iterable[ev.Event]) -> list[ev.Event]:
    steps = set(window_steps(rank))
    return [e for e in events if e.step in steps]


def by_site(events: Iterable[EventT]) -> dict[ev.Site, list[EventT]]:
    """Events grouped by user call site, busiest site first (each group keeps the events' own type)."""
    groups: dict[ev.Site, list[EventT]] = defaultdict(list)
    for event in events:
        site = getattr(event, "site", None)
        if site is not None:
            groups[site].append(event)
    return dict(sorted(groups.items(), key=lambda item: -len(item[1])))


def top_level_ops(rank: RankProfile, step: int | None = None) -> list[Op]:
    steps = set(window_steps(rank)) if step is None else {step}
    return [op for op in rank.ops if op.top_level and op.step in steps]


def ops_per_step(rank: RankProfile) -> float:
    """Median number of host-dispatched ops per window step (runtime op batches when present)."""
    batches = [e for e in in_window(rank, rank.events) if isinstance(e, ev.OpBatch)]
    counts: Counter[int] = Counter()
    if batches:
        for batch in batches:
            counts[batch.step or 0] += batch.count
    else:
        for op in rank.ops:
            if op.costed and op.step is not None:
                counts[op.step] += 1
    values = [counts.get(i, 0) for i in window_steps(rank)]
    return float(statistics.median(values)) if values else 0.0


def matmul_time_share(rank: RankProfile) -> float:
    """Share of kernels-op host time spent in matmuls/convolutions (0.5 when there is no op trace)."""
    kernels = [op for op in rank.ops if op.costed and op.step is not None]
    total = sum(op.duration_ns for op in kernels)
    if not total:
        return 0.5
    return sum(op.duration_ns for op in kernels if op.name in MXU_OPS) / total


def first_time(events: Iterable[ev.Event]) -> int | None:
    return min((e.time_ns for e in events), default=None)


def share(part: float, whole: float) -> float:
    """``part / whole`` as a fraction in [0, 1]: waits that overlap, or clocks from two threads, can sum to more
    than the step, and a report that says "120 % of the step" only makes the reader doubt every other number."""
    return min(max(part / whole, 0.0), 1.0) if whole > 0 else 0.0
