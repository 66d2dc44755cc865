"""The one data model of the estimate flow: a step's programs as captured, and what the TPU compiler made of
them (cost, HBM by kind, verdict, checked suggestions). The CLI, the MCP server and profile reports all render
:class:`CompiledEstimate`; nothing else carries estimate results."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tpu_agent.estimate.hlo import HloSummary


class ArgRole(str, enum.Enum):
    """What an input of a step program holds: it decides how it is sharded and where its HBM is counted."""

    PARAMETER = "parameter"
    OPTIMIZER_STATE = "optimizer_state"
    GRADIENT = "gradient"
    BATCH = "batch"
    OTHER = "other"


@dataclass(frozen=True)
class ArgSpec:
    """One input of a step program, as shapes only: nothing of it is ever allocated.

    ``shard_dim`` is the dimension split across the slice's chips as the script placed it (FSDP2 shards
    parameters on dim 0, data parallelism splits the batch on dim 0); ``None`` means every chip holds all of it.
    ``storage`` names the captured tensor across the step's programs (the same parameter read by two programs has
    one storage), so state that stays on the chip is counted once per program, read there or not.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: ArgRole
    shard_dim: int | None = None
    storage: int | None = None

    def with_dtype(self, dtype: str) -> ArgSpec:
        return replace(self, dtype=dtype)


@dataclass(frozen=True)
class StepProgram:
    """One compiled unit of a training or inference step: a JAX function over its inputs.

    ``donated`` are the inputs the step overwrites in place (parameters and optimizer state updated by the
    optimizer), so the compiler may reuse their HBM for the outputs, as TorchTPU does for in-place updates.
    ``calls`` is how often one step runs it (a captured graph can run several times per step). ``ops`` is how
    many ATen ops it holds, where known: the estimate compiles the largest programs first (0: no guess).
    """

    name: str
    fn: Callable[..., Any]
    args: tuple[ArgSpec, ...]
    donated: tuple[int, ...] = ()
    calls: int = 1
    ops: int = 0

    def with_args(self, args: Sequence[ArgSpec]) -> StepProgram:
        return replace(self, args=tuple(args))


@dataclass(frozen=True)
class HbmBreakdown:
    """HBM one chip needs at the step's peak, by kind, in bytes (from the compiler's memory analysis)."""

    parameters: int
    optimizer_state: int
    gradients: int  # gradients a program reads (the optimizer's inputs when backward and update are apart)
    batch_and_other_inputs: int
    outputs: int  # results that do not reuse an input's buffer (gradients, new tensors)
    temporaries: int  # activations kept for the backward pass and scratch buffers
    code: int

    @property
    def total(self) -> int:
        return (
            self.parameters
            + self.optimizer_state
            + self.gradients
            + self.batch_and_other_inputs
            + self.outputs
            + self.temporaries
            + self.code
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "optimizer_state": self.optimizer_state,
            "gradients": self.gradients,
            "batch_and_other_inputs": self.batch_and_other_inputs,
            "outputs": self.outputs,
            "temporaries": self.temporaries,
            "code": self.code,
            "total": self.total,
        }


@dataclass
class ProgramEstimate:
    """What the compiler reports for one program on one chip of the slice."""

    name: str
    flops: float
    bytes_accessed: float
    transcendentals: float
    optimal_seconds: float
    memory: HbmBreakdown
    hlo: HloSummary
    compiler_argument_bytes: int = 0  # the compiler's own count of the inputs' bytes, a check on ``memory``
    refused: str = ""  # the compiler's out-of-HBM refusal; cost figures are then unknown (0)
    calls: int = 1  # runs per step
    timed_by: str = "compiler"  # "roofline" when the compiler gave no optimal_seconds (see step.program_seconds)
    kernels: list[str] = field(default_factory=list)  # ops lowered as TorchTPU's kernels (runtime.xla.tpu_kernels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "calls": self.calls,
            "timed_by": self.timed_by,
            "kernels": list(self.kernels),
            "flops": self.flops,
            "bytes_accessed": self.bytes_accessed,
            "transcendentals": self.transcendentals,
            "optimal_seconds": self.optimal_seconds,
            "memory": self.memory.to_dict(),
            "compiler_argument_bytes": self.compiler_argument_bytes,
            "refused": self.refused,
            "hlo": self.hlo.to_dict(),
        }


@dataclass(frozen=True)
class Suggestion:
    """A change that was compiled, not guessed: what it is, and whether the step then fits. A change that
    alters the captured graph itself (checkpointing, another batch) cannot be compiled from this capture; it
    is listed with ``verified`` false and no figures, saying how to check it."""

    change: str
    target: str
    fits: bool
    peak_hbm_bytes: int
    step_seconds: float
    verified: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "target": self.target,
            "fits": self.fits,
            "peak_hbm_bytes": self.peak_hbm_bytes,
            "step_seconds": self.step_seconds,
            "verified": self.verified,
        }


@dataclass
class CompiledEstimate:
    """A step compiled for one TPU target: per-chip HBM against the chip's, compiler cost, time and MFU."""

    target: str
    chip_name: str
    chips: int
    strategy: str
    effort: str
    hbm_bytes_per_chip: int
    peak_bf16_flops_per_chip: float
    programs: list[ProgramEstimate]
    model_flops_per_step: float | None = None
    assumptions: list[str] = field(default_factory=list)
    suggestions: list[Suggestion] = field(default_factory=list)
    compiler: str = ""
    # the share of the captured step's ops its programs hold: 1.0 for a whole step; less only when the user asked
    # for a partial estimate (--allow-partial), and then every figure is of that share of the step
    step_ops_share: float = 1.0

    @property
    def peak_hbm_bytes(self) -> int:
        """The largest per-chip HBM need among the step's programs (they run one after another)."""
        return max((program.memory.total for program in self.programs), default=0)

    @property
    def largest_memory(self) -> list[tuple[str, int]]:
        """The largest HBM classes of the step's peak program, largest first (what a fix has to shrink)."""
        if not self.programs:
            return []
        peak = max(self.programs, key=lambda program: program.memory.total).memory.to_dict()
        kinds = [(kind, value) for kind, value in peak.items() if kind not in ("total", "code") and value > 0]
        return sorted(kinds, key=lambda item: -item[1])[:3]

    @property
    def fits(self) -> bool:
        return self.peak_hbm_bytes <= self.hbm_bytes_per_chip and not any(program.refused for program in self.programs)

    @property
    def flops_per_chip(self) -> float:
        return sum(program.flops * program.calls for program in self.programs)

    @property
    def step_seconds(self) -> float:
        return sum(program.optimal_seconds * program.calls for program in self.programs)

    @property
    def useful_flops(self) -> float:
        """The step's model FLOPs when given, else the compiler's FLOPs over the slice."""
        return self.model_flops_per_step if self.model_flops_per_step else self.flops_per_chip * self.chips

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation at the estimated step time (model FLOPs, not recomputation or padding)."""
        if self.step_seconds <= 0:
            return None
        return min(1.0, self.useful_flops / (self.step_seconds * self.peak_bf16_flops_per_chip * self.chips))

    @property
    def calibrated(self) -> dict[str, Any] | None:
        """The step time calibrated against published TPU runs, its band and MFU (see :mod:`.calibration`)."""
        from tpu_agent.estimate.calibration import calibrated_time

        if not self.fits:
            return None
        return calibrated_time(
            self.step_seconds, self.useful_flops, self.chips, self.peak_bf16_flops_per_chip, self.effort
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "chip": self.chip_name,
            "chips": self.chips,
            "strategy": self.strategy,
            "effort": self.effort,
            "compiler": self.compiler,
            "hbm_bytes_per_chip": self.hbm_bytes_per_chip,
            "peak_hbm_bytes_per_chip": self.peak_hbm_bytes,
            "verdict": "fits" if self.fits else "does not fit",
            "largest_memory": [{"kind": kind, "bytes": value} for kind, value in self.largest_memory],
            "flops_per_chip_per_step": self.flops_per_chip,
            "model_flops_per_step": self.model_flops_per_step,
            "step_seconds": self.step_seconds,
            "mfu": self.mfu,
            "step_ops_share": self.step_ops_share,
            "calibrated": self.calibrated,
            "programs": [program.to_dict() for program in self.programs],
            "suggestions": [suggestion.to_dict() for suggestion in self.suggestions],
            "assumptions": list(self.assumptions),
        }
