"""The one data model of ``tpu-agent check``: what was built, and per mode what matched, diverged or failed.

Workers (one process per mode) write :class:`ModeResult` records as JSON; the parent assembles them into a
:class:`CheckReport`, which the CLI, the MCP server and the coverage benchmark all read through ``to_dict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tpu_agent.check.compare import XLA_TOLERANCES, TensorDiff, tolerances_table
from tpu_agent.errors import ExitCode
from tpu_agent.runtime.envvars import EAGER_MODES, EagerModeOption

# The ways a model is run on the ``tpu`` device; each is compared against the same CPU reference.
MODES: dict[str, str] = {
    "strict": "Strict eager: every op runs at once",
    "defer-and-fuse": "DeferAndFuse eager: ops are recorded and run as fused graphs at a flush",
    "compile": 'torch.compile(model, backend="tpu") (Strict eager around the compiled graphs)',
}
PASS, MISMATCH, ERROR = "pass", "mismatch", "error"


def eager_mode_of(mode: str) -> EagerModeOption:
    """The TorchTPU eager mode a check mode runs under (``compile`` runs Strict eager around its graphs): the
    parent sets its environment switch for a worker, a shared worker assigns its enum member."""
    return EAGER_MODES["strict" if mode == "compile" else mode]


# Stages of an error; "build" and "cpu" mean the model never reached the tpu device.
REFERENCE_STAGES = ("build", "cpu")


@dataclass
class ErrorInfo:
    """An exception (or a dead / timed-out worker), where it happened and in which stage."""

    stage: str  # build | cpu | tpu-forward | tpu-backward | flush | worker | timeout
    type: str
    message: str
    location: str = ""  # innermost frame in model or user code, "file:line in function"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ErrorInfo:
        return cls(**data)

    @property
    def on_reference(self) -> bool:
        """Whether the model failed before the tpu run (so the failure says nothing about the device)."""
        return self.stage in REFERENCE_STAGES


@dataclass
class Localisation:
    """Where a mismatch or error starts: the first diverging submodule and the op inside it."""

    module: str  # qualified name ("" is the model itself)
    module_type: str
    kind: str  # forward | backward | error
    detail: str = ""  # the first differing tensor, or the error message
    op: str = ""  # aten op that first diverges (or raises) inside the module
    op_location: str = ""  # where in the model's source that op was called
    op_detail: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Localisation:
        return cls(**data)

    def describe(self) -> str:
        where = f"{self.module or '(model)'} ({self.module_type})"
        text = f"{self.kind} diverges in {where}"
        if self.op:
            text += f", first at {self.op}" + (f" called at {self.op_location}" if self.op_location else "")
        return text


@dataclass
class ModeResult:
    """One mode's verdict against the CPU reference."""

    mode: str
    status: str  # pass | mismatch | error
    outputs_checked: int = 0
    gradients_checked: int = 0
    worst_output: TensorDiff | None = None
    worst_gradient: TensorDiff | None = None
    mismatches: list[TensorDiff] = field(default_factory=list)  # the failing tensors (first MAX_LISTED)
    error: ErrorInfo | None = None
    localisation: Localisation | None = None
    seconds: float = 0.0
    cpu_step_s: float | None = None  # a repeated forward + backward step, when timing was asked for
    tpu_step_s: float | None = None
    through_xla: bool = False  # XLA compiled the mode's graphs: judged under XLA_TOLERANCES (see check.compare)

    MAX_LISTED = 20

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "status": self.status,
            "outputs_checked": self.outputs_checked,
            "gradients_checked": self.gradients_checked,
            "worst_output": self.worst_output.to_dict() if self.worst_output else None,
            "worst_gradient": self.worst_gradient.to_dict() if self.worst_gradient else None,
            "mismatches": [diff.to_dict() for diff in self.mismatches],
            "error": self.error.to_dict() if self.error else None,
            "localisation": self.localisation.to_dict() if self.localisation else None,
            "seconds": round(self.seconds, 3),
            "cpu_step_s": self.cpu_step_s,
            "tpu_step_s": self.tpu_step_s,
            "through_xla": self.through_xla,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModeResult:
        def diff(value: dict[str, Any] | None) -> TensorDiff | None:
            return TensorDiff(**value) if value else None

        return cls(
            mode=data["mode"],
            status=data["status"],
            outputs_checked=data.get("outputs_checked", 0),
            gradients_checked=data.get("gradients_checked", 0),
            worst_output=diff(data.get("worst_output")),
            worst_gradient=diff(data.get("worst_gradient")),
            mismatches=[TensorDiff(**item) for item in data.get("mismatches", [])],
            error=ErrorInfo.from_dict(data["error"]) if data.get("error") else None,
            localisation=Localisation.from_dict(data["localisation"]) if data.get("localisation") else None,
            seconds=data.get("seconds", 0.0),
            cpu_step_s=data.get("cpu_step_s"),
            tpu_step_s=data.get("tpu_step_s"),
            through_xla=data.get("through_xla", False),
        )


@dataclass
class ModelInfo:
    """What was built: the spec as given, its kind, the class, the task and where the weights came from."""

    spec: str
    kind: str  # hf-type | directory | factory
    name: str = ""  # model class name
    task: str = ""
    weights: str = "random init"
    parameters: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckReport:
    """The result of :func:`tpu_agent.check.check_model`."""

    model: ModelInfo
    modes: list[ModeResult]
    backend: str = "emulated"
    matmul_precision: str = "highest"
    compiler: str | None = None  # the emulation's graph compiler (xla or eager); None on real torch_tpu

    @property
    def status(self) -> str:
        """``pass`` when every mode passed, else ``error`` if any mode errored, else ``mismatch``."""
        statuses = {result.status for result in self.modes}
        if statuses <= {PASS}:
            return PASS
        return ERROR if ERROR in statuses else MISMATCH

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.OK if self.status == PASS else ExitCode.FINDINGS

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "tpu-agent-check.v1",
            "status": self.status,
            "model": self.model.to_dict(),
            "backend": self.backend,
            "matmul_precision": self.matmul_precision,
            "compiler": self.compiler,
            "tolerances": tolerances_table(),
            "xla_tolerances": tolerances_table(XLA_TOLERANCES),  # for the modes marked through_xla
            "modes": [result.to_dict() for result in self.modes],
        }


__all__ = [
    "ERROR",
    "MISMATCH",
    "MODES",
    "PASS",
    "CheckReport",
    "ErrorInfo",
    "Localisation",
    "ModeResult",
    "ModelInfo",
    "eager_mode_of",
]
