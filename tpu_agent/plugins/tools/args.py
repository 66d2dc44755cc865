"""The MCP tools' argument types, each defined once with its description and declared limits.

The choice lists come from the code that owns them (the runtime's backends and eager modes, estimate's
strategies, the chip table's parser), so the schemas offer exactly what ``tpu-agent run`` accepts and a chip is spelt the same
way in the CLI and here: a generation (``v5e``) or a slice (``v5e-8``), canonicalised by
:func:`tpu_agent.chips.parse_target`. Every string and list has a maximum length (``tpu_agent.plugins.limits``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from tpu_agent.chips import TARGET_EXAMPLES, parse_target
from tpu_agent.errors import TpuAgentError
from tpu_agent.estimate.options import EFFORTS, STRATEGIES, efforts_help
from tpu_agent.plugins.jobs import JOB_ID_PATTERN
from tpu_agent.plugins.limits import (
    MAX_CHIP_CHARS,
    MAX_ID_CHARS,
    MAX_PATH_CHARS,
    MAX_PATHS,
    MAX_RANKS,
    MAX_RULE_CODE_CHARS,
    MAX_RULE_CODES,
    MAX_SCRIPT_ARG_CHARS,
    MAX_SCRIPT_ARGS,
)
from tpu_agent.plugins.plans import PLAN_ID_PATTERN
from tpu_agent.runtime.envvars import EAGER_MODES
from tpu_agent.runtime.select import BACKENDS
from tpu_agent.runtime.xla.settings import COMPILERS, DEFAULT_COMPILER

#: Hosts cut tool calls off (Codex: 60 s by default); job tools return within this and hand back a job id.
MAX_WAIT_S = 50


def _canonical_chip(spec: str) -> str:
    try:
        return parse_target(spec).spec
    except TpuAgentError as error:
        raise ValueError(f"{error.message}; {error.hint}") from None


WorkspaceArg = Annotated[
    str | None,
    Field(
        max_length=MAX_PATH_CHARS,
        description="Absolute path of the project directory. Defaults to the server's --workspace, the "
        "host's project directory (CLAUDE_PROJECT_DIR), or the client's first MCP root. When the server was "
        "started with a workspace, only that directory or one inside it.",
    ),
]
PathText = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)]
PathsArg = Annotated[
    list[PathText],
    Field(min_length=1, max_length=MAX_PATHS, description="Files or directories, relative to the workspace."),
]
# The script a run/profile job launches, as `tpu-agent run` and `tpu-agent profile` take it.
EntrypointArg = Annotated[
    str, Field(min_length=1, max_length=MAX_PATH_CHARS, description="Workspace-relative .py script, e.g. 'train.py'.")
]
ScriptArgsArg = Annotated[
    list[Annotated[str, Field(max_length=MAX_SCRIPT_ARG_CHARS)]],
    Field(max_length=MAX_SCRIPT_ARGS, description="Script arguments, passed verbatim."),
]
NprocArg = Annotated[
    int,
    Field(ge=1, le=MAX_RANKS, description="Processes (ranks) on this host; the server allows at most its --max-ranks."),
]
BackendArg = Annotated[
    Literal[BACKENDS],  # type: ignore[valid-type]  # the runtime's one tuple of backend names
    Field(description="auto: real torch_tpu when it sees a TPU, else the CPU emulation of the tpu device."),
]
ChipSpec = Annotated[str, Field(min_length=1, max_length=MAX_CHIP_CHARS), AfterValidator(_canonical_chip)]
ChipArg = Annotated[
    ChipSpec | None,
    Field(
        description=f"TPU the emulation presents: {TARGET_EXAMPLES}. Unnamed: the command's default; a named "
        "chip also refuses an nproc its TorchTPU hosts do not run (a v6e host: 1, 4 or 8)."
    ),
]
EstimateChipArg = Annotated[
    ChipSpec | None,
    Field(description=f"Estimate for this TPU instead of the one the capture was made for: {TARGET_EXAMPLES}."),
]
EagerModeArg = Annotated[  # type: ignore[valid-type]  # a Literal built from the runtime's one table of modes
    Literal[tuple(EAGER_MODES)] | None,
    Field(description="TorchTPU eager mode (default: the environment's, else strict)."),
]
StrategyArg = Annotated[
    Literal[STRATEGIES] | None,  # type: ignore[valid-type]  # estimate's one tuple of strategies
    Field(description="Sharding over the slice (default: data-parallel on a slice, as-captured on one chip)."),
]
EffortArg = Annotated[
    Literal[EFFORTS],  # type: ignore[valid-type]  # estimate's one tuple of compiler efforts
    Field(description=efforts_help()),
]
CompilerArg = Annotated[
    Literal[COMPILERS] | None,  # type: ignore[valid-type]  # the runtime's one tuple of compiler names
    Field(
        description="Emulation only: 'xla' compiles torch.compile and DeferAndFuse graphs with XLA, 'eager' runs "
        f"them op by op (default: the server's TPU_AGENT_COMPILER, else {DEFAULT_COMPILER})."
    ),
]
TimeoutArg = Annotated[int, Field(ge=1, le=86_400, description="The job is killed after this many seconds.")]
WaitArg = Annotated[int, Field(ge=0, le=MAX_WAIT_S, description="How long this call waits, in seconds.")]
RuleCodes = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_RULE_CODE_CHARS)]] | None,
    Field(
        min_length=1,
        max_length=MAX_RULE_CODES,
        description="Rule codes or code prefixes (e.g. ['TPU1']); default: every rule.",
    ),
]
RuleCodeArg = Annotated[
    str, Field(min_length=1, max_length=MAX_RULE_CODE_CHARS, description="Rule code from a finding, e.g. 'TPU101'.")
]
JobIdArg = Annotated[
    str,
    Field(max_length=MAX_ID_CHARS, pattern=JOB_ID_PATTERN, description="The job_id tpu_run or tpu_profile returned."),
]
PlanIdArg = Annotated[
    str,
    Field(max_length=MAX_ID_CHARS, pattern=PLAN_ID_PATTERN, description="The plan_id tpu_plan_migration returned."),
]
LogdirArg = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=MAX_PATH_CHARS,
        description="Workspace-relative profile directory, below the workspace root (diagnose writes next to it).",
    ),
]

__all__ = [
    "MAX_WAIT_S",
    "BackendArg",
    "ChipArg",
    "CompilerArg",
    "EagerModeArg",
    "EntrypointArg",
    "EstimateChipArg",
    "JobIdArg",
    "LogdirArg",
    "NprocArg",
    "PathsArg",
    "PlanIdArg",
    "RuleCodeArg",
    "RuleCodes",
    "ScriptArgsArg",
    "StrategyArg",
    "TimeoutArg",
    "WaitArg",
    "WorkspaceArg",
]
