"""What the TPU compiler made of the captured step, as the diagnostics read it.

``tpu-agent profile`` compiles the script's step with libtpu (``tpu-agent estimate``) when it is installed and
keeps the estimate document (docs/estimate-json-schema.md) in the capture's raw directory, so that
``tpu-agent diagnose`` of the same log directory reaches the same verdicts. That document is read back here
into :class:`CompiledStep`: the figures the compiled-program diagnostics (SH-4, SD-3, SD-4) weigh, checked for
type like every other capture file (a crafted ``compiled.json`` is a clear error, never a traceback).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_agent.chips import Chip, parse_target
from tpu_agent.estimate.hlo import parse_arrays
from tpu_agent.profile.untrusted import damaged, reading, valid_dataclass


@dataclass(frozen=True)
class CompiledMatmul:
    """One of the costliest matmuls of a compiled program: its result's dims as the compiler shaped them."""

    dims: tuple[int, ...]
    dtype: str
    flops: float
    op_name: str


@dataclass(frozen=True)
class CompiledCollective:
    """All collectives of one kind in a compiled program (``all-reduce``, ``all-gather``, ...)."""

    kind: str
    count: int
    bytes: float


@dataclass(frozen=True)
class CompiledProgram:
    """One compiled program of the step (forward, backward, optimizer update, or a whole step)."""

    name: str
    calls: int
    flops: float
    optimal_seconds: float
    hbm_bytes: int
    refused: str
    collectives: tuple[CompiledCollective, ...]
    top_matmuls: tuple[CompiledMatmul, ...]
    layout_padding_fraction: float


@dataclass(frozen=True)
class CompiledSuggestion:
    """A change `tpu-agent estimate` compiled to see whether the step then fits."""

    change: str
    target: str
    fits: bool
    peak_hbm_bytes: int


@dataclass
class CompiledStep:
    """The step as compiled for one TPU target (``v5e``, ``v5e-8``): per-chip HBM, programs, checked fixes.

    ``document`` is the estimate document itself, shown in the reports' compiler section; every field of it
    that section prints is one of the checked fields here."""

    target: str
    chips: int
    strategy: str
    hbm_bytes_per_chip: int
    peak_hbm_bytes: int
    fits: bool
    step_seconds: float
    mfu: float | None
    programs: tuple[CompiledProgram, ...]
    suggestions: tuple[CompiledSuggestion, ...]
    document: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def chip(self) -> Chip:
        return parse_target(self.target).chip


def _program(data: dict[str, Any]) -> CompiledProgram:
    hlo = data["hlo"]
    matmuls = []
    for matmul in hlo["top_matmuls"]:
        arrays = parse_arrays(str(matmul["shape"]))
        if arrays:
            matmuls.append(CompiledMatmul(arrays[0].dims, arrays[0].dtype, matmul["flops"], matmul["op_name"]))
    return CompiledProgram(
        name=data["name"],
        calls=data["calls"],
        flops=data["flops"],
        optimal_seconds=data["optimal_seconds"],
        hbm_bytes=data["memory"]["total"],
        refused=data["refused"],
        collectives=tuple(
            CompiledCollective(kind, totals["count"], totals["bytes"]) for kind, totals in hlo["collectives"].items()
        ),
        top_matmuls=tuple(matmuls),
        layout_padding_fraction=hlo["layout_padding_fraction"],
    )


def compiled_step(document: dict[str, Any]) -> CompiledStep:
    """Read an estimate document (``tpu-agent estimate --format json``, or ``ScriptEstimate.document``).

    Raises ``KeyError`` / ``TypeError`` / ``ValueError`` on a document of the wrong shape; callers reading a
    file wrap this in :func:`tpu_agent.profile.untrusted.reading`."""
    estimate = document["estimate"]
    step = CompiledStep(
        target=estimate["target"],
        chips=estimate["chips"],
        strategy=estimate["strategy"],
        hbm_bytes_per_chip=estimate["hbm_bytes_per_chip"],
        peak_hbm_bytes=estimate["peak_hbm_bytes_per_chip"],
        fits=estimate["verdict"] == "fits",
        step_seconds=estimate["step_seconds"],
        mfu=estimate["mfu"],
        programs=tuple(_program(program) for program in estimate["programs"]),
        suggestions=tuple(
            CompiledSuggestion(s["change"], s["target"], s["fits"], s["peak_hbm_bytes"])
            for s in estimate["suggestions"]
        ),
        document=document,
    )
    parts = [step, *step.programs, *step.suggestions]
    parts += [part for program in step.programs for part in (*program.collectives, *program.top_matmuls)]
    wrong = next((part for part in parts if not valid_dataclass(part)), None)
    if wrong is not None:
        raise TypeError(f"a {type(wrong).__name__} with a value of the wrong type: {wrong!r:.200}")
    for target in (step.target, *(s.target for s in step.suggestions)):
        parse_target(target)  # an unknown target is refused here, with the list of known ones
    if estimate["verdict"] not in ("fits", "does not fit"):
        raise ValueError(f"verdict {estimate['verdict']!r}")
    if step.hbm_bytes_per_chip <= 0 or step.chips < 1:
        raise ValueError(f"target {step.target!r}: {step.chips} chips with {step.hbm_bytes_per_chip} bytes of HBM")
    return step


def load_compiled(path: Path) -> CompiledStep | None:
    """The compiled step kept in a capture (``None`` when the capture has none)."""
    if not path.exists():
        return None
    with reading(path, "the TPU compiler's estimate"):
        document = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict):
            raise damaged(path, "the TPU compiler's estimate is not a JSON object")
        return compiled_step(document)


__all__ = [
    "CompiledCollective",
    "CompiledMatmul",
    "CompiledProgram",
    "CompiledStep",
    "CompiledSuggestion",
    "compiled_step",
    "load_compiled",
]
