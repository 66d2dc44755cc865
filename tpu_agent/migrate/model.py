"""The migrate data model: rules, findings, per-file results, plans and apply results.

One model serves every stage: the engine fills :class:`FileResult` objects into a :class:`Plan`
(touching nothing on disk), :func:`tpu_agent.migrate.api.apply` writes a plan, and the report renderers
(text, JSON, SARIF, Markdown), the CLI and the MCP server all read the same objects. ``to_dict`` methods
define the stable JSON schema agents consume (documented in ``docs/migrate-json-schema.md``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path


class Safety(str, Enum):
    """How far a rule may go on its own (the ruff model)."""

    SAFE = "safe"  # applied by default: same behaviour on CUDA, CPU and TPU
    UNSAFE = "unsafe"  # applied only with --unsafe-fixes: rests on an assumption the report names
    MANUAL = "manual"  # never rewritten: a person must port it; reported with what to do


class Target(str, Enum):
    """What device code the rewrite produces."""

    ACCELERATOR = "accelerator"  # device-agnostic torch.accelerator code, still runs on CPU and CUDA
    TPU = "tpu"  # literal "tpu" devices and TorchTPU-only forms


@dataclass(frozen=True)
class ApiEquivalent:
    """One CUDA API a rule covers and what it becomes on TPU: the rows ``tpu_lookup_api`` answers with.

    ``cuda`` is how the API is written in user code (``torch.cuda.synchronize()``); ``tpu`` the TorchTPU or
    device-agnostic form (for MANUAL rules: what a person should use); ``note`` anything the rule's
    rationale does not already say about this one API.
    """

    cuda: str
    tpu: str
    note: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"cuda": self.cuda, "tpu": self.tpu, "note": self.note}


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One migration rule as data: what ``tpu-agent rules CODE`` prints, the report cites and the API lookup
    answers from. Declared with keyword fields only (``Family.rule(code=..., name=..., ...)``)."""

    code: str  # stable, e.g. "TPU101"; never reused once published
    name: str  # kebab-case, e.g. "cuda-device-string"
    family: str  # devices | cuda-api | amp | distributed | compile | backend-flags | env-vars | third-party
    safety: Safety
    summary: str  # one line: what the rule finds
    rationale: str  # why it matters on TPU
    before: str  # example input (a few lines of Python or shell)
    after: str  # the same example after the rule (for MANUAL rules: the TODO / suggested port)
    # where to read more: public URLs and sections of docs/ shipped with tpu-agent (docs/torchtpu-migration.md#...)
    references: tuple[str, ...]
    since_torch: str | None = None  # the oldest torch that has the emitted API, when it matters
    apis: tuple[ApiEquivalent, ...] = ()  # the CUDA APIs the rule covers, one row each for the API lookup
    # the safety under the tpu target where it differs: a fix that is unsafe only because the same script may still
    # run on a CUDA cluster (dropping an NCCL or cuBLAS setting) is safe once the migrated code targets TPU alone
    tpu_safety: Safety | None = None

    def safety_for(self, target: Target) -> Safety:
        """How far the rule goes on its own when migrating for ``target``."""
        return self.tpu_safety if target is Target.TPU and self.tpu_safety is not None else self.safety

    @property
    def reference(self) -> str:
        """The references as one line (what the text report and ``tpu-agent rules CODE`` print)."""
        return "; ".join(self.references)

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "name": self.name,
            "family": self.family,
            "safety": self.safety.value,
            "summary": self.summary,
            "rationale": self.rationale,
            "before": self.before,
            "after": self.after,
            "reference": self.reference,
            "references": list(self.references),
            "since_torch": self.since_torch,
            "apis": [api.to_dict() for api in self.apis],
            "tpu_safety": self.tpu_safety.value if self.tpu_safety is not None else None,
        }


@dataclass(frozen=True)
class Finding:
    """One CUDA-specific reference found in a file, fixed or not.

    ``fixed`` is True when the plan rewrites it; an UNSAFE finding without ``--unsafe-fixes`` and every
    MANUAL finding have ``fixed=False`` and a ``message`` saying what to do.
    """

    code: str
    path: str  # as the user gave it (relative to the cwd when possible)
    line: int  # 1-based
    column: int  # 1-based
    message: str
    safety: Safety
    fixed: bool
    end_line: int | None = None
    end_column: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "message": self.message,
            "safety": self.safety.value,
            "fixed": self.fixed,
        }


class FileKind(str, Enum):
    PYTHON = "python"
    NOTEBOOK = "notebook"
    SHELL = "shell"
    ENV = "env"
    YAML = "yaml"
    DOCKERFILE = "dockerfile"
    CUDA_SOURCE = "cuda-source"  # .cu/.cuh files: inventoried as manual items, never rewritten
    DEPENDENCIES = "dependencies"  # requirements*.txt, pyproject.toml, setup.cfg, Pipfile: reported, never rewritten


@dataclass
class FileResult:
    """What the engine decided for one file. ``migrated_bytes`` is None when nothing changes."""

    path: Path
    display_path: str
    kind: FileKind
    original_sha256: str
    migrated_bytes: bytes | None = None
    findings: list[Finding] = field(default_factory=list)
    skipped_reason: str | None = None  # syntax error with path:line, undecodable bytes, symlink leaving the tree
    prefiltered: bool = False  # skipped cheaply: no CUDA-ish token in the file
    lines: int = 0

    @property
    def changed(self) -> bool:
        return self.migrated_bytes is not None

    @property
    def cuda_references(self) -> int:
        return len(self.findings)

    @property
    def converted_references(self) -> int:
        return sum(1 for f in self.findings if f.fixed)


@dataclass
class MigrateOptions:
    """Every knob of ``tpu-agent migrate`` that changes what the plan contains."""

    select: frozenset[str] | None = None  # codes or code prefixes; None means all rules
    ignore: frozenset[str] = frozenset()
    unsafe_fixes: bool = False
    target: Target = Target.ACCELERATOR
    annotate: bool = False  # insert "# TODO(tpu-agent CODE): ..." comments at manual items
    jobs: int = 0  # 0: one worker per core
    # seconds a file the parse guard deems risky (deeply nested, or rejected by the stdlib parser) may take in
    # its sacrificial process before it is skipped; ordinary files are migrated in-process with no budget
    file_budget_s: float = 60.0
    # the oldest torch the migrated code must run on: a rewrite whose target API is newer (Rule.since_torch)
    # is reported instead of applied; None: the installed torch's APIs are all allowed
    min_torch: str | None = None

    def to_dict(self) -> dict[str, object]:
        """The options as reports and stored plans record them (the JSON schema's ``options`` object)."""
        return {
            "select": sorted(self.select) if self.select is not None else None,
            "ignore": sorted(self.ignore),
            "unsafe_fixes": self.unsafe_fixes,
            "target": self.target.value,
            "annotate": self.annotate,
            "min_torch": self.min_torch,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> MigrateOptions:
        """Inverse of :meth:`to_dict` (``jobs`` and ``file_budget_s`` are runtime choices, not part of a plan)."""
        select = data.get("select")
        return cls(
            select=frozenset(select) if isinstance(select, list) else None,
            ignore=frozenset(str(code) for code in ignore)
            if isinstance(ignore := data.get("ignore"), list)
            else frozenset(),
            unsafe_fixes=bool(data.get("unsafe_fixes")),
            target=Target(str(data.get("target", Target.ACCELERATOR.value))),
            annotate=bool(data.get("annotate")),
            min_torch=str(data["min_torch"]) if data.get("min_torch") else None,
        )

    def torch_allows(self, since_torch: str | None) -> bool:
        """Whether an API that exists since ``since_torch`` may be emitted under ``--min-torch``."""
        if self.min_torch is None or since_torch is None:
            return True
        return torch_version(since_torch) <= torch_version(self.min_torch)

    def rule_enabled(self, code: str) -> bool:
        if any(code.startswith(prefix) for prefix in self.ignore):
            return False
        return self.select is None or any(code.startswith(prefix) for prefix in self.select)


@dataclass
class Plan:
    """The result of ``plan()``: every file examined, what would change, and why. Touches nothing."""

    roots: list[Path]
    options: MigrateOptions
    files: list[FileResult]
    # temporary files an interrupted in-place run left in the tree; an in-place apply removes them
    stale_temp_files: list[Path] = field(default_factory=list)

    @property
    def changed_files(self) -> list[FileResult]:
        return [f for f in self.files if f.changed]

    @property
    def findings(self) -> list[Finding]:
        return [finding for f in self.files for finding in f.findings]

    @property
    def manual_findings(self) -> list[Finding]:
        return [f for f in self.findings if not f.fixed]


@dataclass
class ApplyResult:
    """What ``apply()`` wrote. ``written`` are absolute paths of files replaced or created."""

    written: list[Path]
    unchanged: list[Path]
    output_dir: Path | None = None
    removed_temp_files: list[Path] = field(default_factory=list)  # left by an interrupted run, now gone
    not_copied: list[str] = field(default_factory=list)  # "path: why" for files an --output-dir copy left out
    copied: list[Path] = field(default_factory=list)  # of ``written`` into an --output-dir: source bytes as they were


def torch_version(text: str) -> tuple[int, int]:
    """``"2.7"``, ``"2.7.1"`` or ``"2.7.0+cu121"`` as (major, minor); ValueError for anything else."""
    parts = text.strip().split("+")[0].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"not a torch version: {text!r} (expected MAJOR.MINOR, e.g. 2.5)")
    return int(parts[0]), int(parts[1])


def sha256_bytes(data: bytes) -> str:
    """Content hash used to detect files that changed between plan and apply."""
    return hashlib.sha256(data).hexdigest()
