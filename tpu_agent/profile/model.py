"""The one data model every profile analysis reads, and the findings the rules write.

A capture (our own run, or a foreign XSpace) is loaded into a :class:`ProfileModel`: per rank the steps,
host ops (with shapes, dtypes, FLOPs, bytes), the runtime event log, memory, DataLoader waits, the
weights of the modules that ran, and the run configuration. Rules never look at files; they read this
model, so a rule works the same on a fresh capture and on ``tpu-agent diagnose`` of an old one.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from tpu_agent.chips import Chip
from tpu_agent.profile.compiled import CompiledStep
from tpu_agent.runtime.events import Event, Site


class Severity(str, Enum):
    """How much a finding matters: ``error`` > 30 % of step at stake or a capture that cannot be trusted."""

    error = "error"
    warning = "warning"
    info = "info"

    @property
    def rank(self) -> int:
        return {"error": 0, "warning": 1, "info": 2}[self.value]


class Status(str, Enum):
    """What a rule concluded: a verdict needs its data; without it the rule says so."""

    ok = "ok"
    finding = "finding"
    insufficient_data = "insufficient_data"


@dataclass(frozen=True)
class Location:
    """A user source line a finding points at, with the share of step time spent there when known."""

    file: str
    line: int
    function: str
    share_of_step: float | None = None
    code: str = ""  # the source line, filled in by the rule engine

    @classmethod
    def from_site(cls, site: Site, share_of_step: float | None = None) -> Location:
        return cls(file=site.file, line=site.line, function=site.function, share_of_step=share_of_step)

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclass(frozen=True)
class Evidence:
    """The measurement behind a verdict: ``metric`` was ``value`` against ``threshold`` over ``steps``."""

    metric: str
    value: float
    threshold: float
    unit: str = ""
    steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Verification:
    """What checking a diff found (:mod:`tpu_agent.profile.verify`): the patched copy ran, its first losses and the
    rule's measure before and after.

    ``status``: ``verified`` (the diff is offered), ``failed`` (the check ran and refused it: the diff is withdrawn
    and ``reason`` says why) or ``not_checked`` (verification was off or skipped: the diff stays, marked so)."""

    status: str  # verified | failed | not_checked
    reason: str
    metric: str = ""
    before: float | None = None
    after: float | None = None  # 0 when the finding is gone
    losses_before: tuple[float, ...] = ()
    losses_after: tuple[float, ...] = ()
    seconds: float = 0.0


@dataclass(frozen=True)
class AgentChange:
    """What a coding agent should edit: a description and, when the change is local, a unified diff.

    ``verification`` says whether the diff was applied to a copy, run and shown to remove its finding; a diff the
    check refused is not kept (``diff`` is None and the verification says why). A rule that knows no edit the check
    could prove says why in ``no_diff_reason`` (advice is a promise: words without a diff say why there is none)."""

    description: str
    diff: str | None = None
    verification: Verification | None = None
    no_diff_reason: str = ""

    @property
    def verified(self) -> bool:
        return self.verification is not None and self.verification.status == "verified"


@dataclass
class Finding:
    """One diagnosis: rule, verdict, evidence, where in the code, what to do, and what it may save."""

    rule_id: str
    name: str
    category: str
    severity: Severity
    title: str
    evidence: Evidence
    locations: list[Location]
    suggestion: str
    agent_change: AgentChange | None
    estimated_saving_pct: float
    confidence: float
    time_ns: int | None = None  # where it shows on the trace-viewer timeline
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity.value
        data["evidence"]["steps"] = list(self.evidence.steps)
        if self.agent_change is not None:
            data["agent_change"]["verified"] = self.agent_change.verified
            if self.agent_change.verification is not None:
                verification = data["agent_change"]["verification"]
                verification["losses_before"] = list(verification["losses_before"])
                verification["losses_after"] = list(verification["losses_after"])
        return data


@dataclass
class RuleOutcome:
    """What one rule concluded on one capture (kept for every rule, so silence is never ambiguous)."""

    rule_id: str
    status: Status
    reason: str = ""
    findings: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"rule_id": self.rule_id, "status": self.status.value, "reason": self.reason, "findings": self.findings}


@dataclass(frozen=True)
class Step:
    """One training step on one rank: ``[start_ns, end_ns)`` in wall-clock nanoseconds."""

    index: int
    start_ns: int
    end_ns: int
    source: str  # optimizer | profiler | annotation | xspace

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(slots=True)
class Op:
    """One host-dispatched operator instance (an aten op from torch.profiler, or an XSpace host event)."""

    name: str
    start_ns: int
    duration_ns: int
    thread: int
    input_shapes: list[list[int]] = field(default_factory=list)
    input_dtypes: list[str] = field(default_factory=list)
    flops: float = 0.0
    bytes: float = 0.0
    top_level: bool = True  # not nested inside another op: the op a user line dispatched
    costed: bool = True  # FLOPs/bytes counted here: matmuls and leaf ops outside them (each kernel once)
    step: int | None = None
    concrete_inputs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Weight:
    """A module weight that feeds a matmul: who owns it, its shape and dtype, and where it is defined."""

    module: str  # qualified name, e.g. "blocks.0.mlp.fc1"
    module_type: str
    shape: tuple[int, ...]
    dtype: str
    site: Site | None


@dataclass(frozen=True)
class DataLoaderInfo:
    """A DataLoader the script built: its settings and the line that built it."""

    batch_size: int | None
    num_workers: int
    drop_last: bool
    dataset_len: int | None
    site: Site | None


@dataclass(frozen=True)
class DataWait:
    """Time the step spent inside ``DataLoader.__next__`` and the line that iterated."""

    step: int | None
    duration_ns: int
    site: Site | None
    time_ns: int


@dataclass(frozen=True)
class MemoryBreakdown:
    """Model state per device in bytes, measured from the tensors themselves (works on ``meta`` too)."""

    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int  # peak per step minus resident state, 0 when unknown
    peak_bytes: int


@dataclass(frozen=True)
class MemoryPoint:
    """Allocated bytes at one instant (for the memory-over-time plot)."""

    time_ns: int
    allocated_bytes: int


@dataclass
class RankProfile:
    """Everything measured on one rank."""

    rank: int
    host: str = "localhost"
    steps: list[Step] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    memory: MemoryBreakdown | None = None
    memory_timeline: list[MemoryPoint] = field(default_factory=list)
    step_peaks: dict[int, int] = field(default_factory=dict)  # step index -> peak allocated bytes in it
    dataloaders: list[DataLoaderInfo] = field(default_factory=list)
    data_waits: list[DataWait] = field(default_factory=list)
    weights: list[Weight] = field(default_factory=list)
    module_types: list[str] = field(default_factory=list)  # classes of the root modules that ran
    forward_site: Site | None = None  # the user line that called the root module
    window_eager_mode: str | None = None  # the eager mode in force when the measured window began
    step_site: Site | None = None  # the user line that ended a step (optimizer.step / annotation)
    window: tuple[int, int] | None = None  # first and last step index inside the op-trace window
    has_op_trace: bool = False
    has_memory_trace: bool = False
    has_device_trace: bool = False
    warnings: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # the first steps' losses (what backward() was called on)

    def steps_in_window(self) -> list[Step]:
        """The steps the op trace covers (all steps when there is no window)."""
        if self.window is None:
            return list(self.steps)
        first, last = self.window
        return [s for s in self.steps if first <= s.index <= last]

    def median_step_ns(self, steps: Iterable[Step] | None = None) -> float | None:
        durations = [s.duration_ns for s in (self.steps_in_window() if steps is None else steps)]
        return statistics.median(durations) if durations else None

    def step_of(self, time_ns: int) -> int | None:
        """The step index containing ``time_ns`` (binary search over sorted steps)."""
        lo, hi = 0, len(self.steps) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            step = self.steps[mid]
            if time_ns < step.start_ns:
                hi = mid - 1
            elif time_ns >= step.end_ns:
                lo = mid + 1
            else:
                return step.index
        return None


@dataclass
class RunConfig:
    """How the run was configured (from the runtime's RunInfo, the CLI options, or the XSpace)."""

    chip: Chip
    eager_mode: str | None = None  # DEFER_NEVER | DEFER_NEVER_AND_LAUNCH_BLOCKING | DEFER_AND_FUSE | None
    backend: str | None = None  # emulated | torch_tpu | None (plain torch or foreign capture)
    world_size: int = 1
    env: dict[str, str] = field(default_factory=dict)
    script: str | None = None
    script_args: list[str] = field(default_factory=list)  # its command line after the script (its own flags)
    requested_steps: int | None = None
    requested_warmup: int | None = None
    source: str = "tpu-agent"  # tpu-agent | xspace
    session: str | None = None  # the XProf session directory name this capture writes to


@dataclass
class ProfileModel:
    """The loaded capture: configuration plus one :class:`RankProfile` per rank."""

    config: RunConfig
    ranks: dict[int, RankProfile]
    compiled: CompiledStep | None = None  # the step as the TPU compiler compiled it, when libtpu ran

    @property
    def primary(self) -> RankProfile:
        """Rank 0 (or the lowest rank present): the rank whose per-step view the reports show."""
        return self.ranks[min(self.ranks)]

    def all_events(self) -> list[Event]:
        return [e for rank in self.ranks.values() for e in rank.events]


@dataclass
class Estimate:
    """The roofline estimate of the step on a TPU and the assumptions it rests on (always printed together)."""

    chip: str
    available: bool
    steps: int = 0
    flops_per_step: float = 0.0
    bytes_per_step: float = 0.0
    arithmetic_intensity: float = 0.0  # FLOPs per byte
    ridge_point: float = 0.0  # the chip's FLOPs per byte where compute and memory balance
    eager_step_s: float = 0.0
    fused_step_s: float = 0.0
    eager_mfu: float = 0.0
    fused_mfu: float = 0.0
    bound: str = ""  # compute | memory
    assumptions: list[str] = field(default_factory=list)
    method: str = "roofline"  # "roofline", or "tpu-compiler" when ``compiler`` holds libtpu's own estimate
    compiler: dict[str, Any] | None = None  # `tpu-agent estimate`'s "estimate" object (docs/estimate-json-schema.md)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Diagnosis:
    """Findings, per-rule outcomes and the TPU estimate for one capture, plus where it all was written.

    ``document`` is the JSON report (schema in docs/profile-json-schema.md), built once by
    :func:`tpu_agent.profile.report.document.build_document` when the diagnosis is complete (exit code and
    XSpace paths set) and shared by every renderer, so a report file and the CLI's output cannot disagree.
    """

    logdir: Path
    model: ProfileModel
    findings: list[Finding]
    outcomes: list[RuleOutcome]
    estimate: Estimate
    xplane_paths: list[Path] = field(default_factory=list)
    report_paths: list[Path] = field(default_factory=list)
    exit_code: int | None = None  # the profiled script's, when this came from `profile`
    verification: dict[str, Any] | None = None  # whether the diffs were checked (tpu_agent.profile.verify), why not
    document: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def has_errors(self) -> bool:
        return any(f.severity == Severity.error for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report; only a complete diagnosis (one ``diagnose``/``profile`` returned) has one."""
        if self.document is None:
            raise ValueError("the report document is built when the diagnosis is complete")
        return self.document
