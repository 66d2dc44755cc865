"""``estimate_script``: run a user's script on the emulated device for a few steps, capture its step's graphs and
compile them for a TPU target (the library entry point behind ``tpu-agent estimate`` and the MCP tool).

The script runs in a child process under the runtime (one rank, DeferAndFuse, the XLA compiler) with the
capture hook of :mod:`tpu_agent.estimate.capture`; the child compiles and writes ``estimate.json``
atomically, and this side reads it back. The compiler is checked here first, so a machine without libtpu
gets the install hint before a script runs for nothing.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_agent.chips import SLICE_GENERATIONS, parse_target
from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.estimate import host_bound
from tpu_agent.estimate.compiler import require_compiler, supported_chip_counts
from tpu_agent.estimate.layout import ESTIMATE_DIR_ENV, HOOK_SPEC, OPTIONS_FILE, RESULT_FILE
from tpu_agent.estimate.options import (
    DEFAULT_EFFORT,
    DEFAULT_OPTIMIZER_STEPS,
    EFFORTS,
    MAX_OPTIMIZER_STEPS,
    MIN_OPTIMIZER_STEPS,
    STRATEGIES,
)
from tpu_agent.fsutil import atomic_write_text

_KILLED = (128 + signal.SIGKILL, -signal.SIGKILL)  # a shell's and subprocess's ways of saying "killed"
# JSON schema version of the estimate document (docs/estimate-json-schema.md).
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class EstimateOptions:
    """What to estimate for: a target (``v5e-4``), a sharding strategy, steps to watch, whether to suggest fixes."""

    target: str
    strategy: str | None = None  # None: as-captured on one chip, data-parallel on a slice
    steps: int = DEFAULT_OPTIMIZER_STEPS
    suggest: bool = True
    timeout_s: float | None = None
    capture_only: bool = False  # record the step from shapes without computing it (tpu_agent.estimate.capture_only)
    allow_partial: bool = False  # figures from the compiled part of a step that has graphs XLA could not take
    host_memory_bytes: int | None = None  # the bound that switches to capture-only (None: host_bound's default)
    effort: str = DEFAULT_EFFORT  # the compiler's effort at the program's speed (options.EFFORTS)

    def resolved_strategy(self) -> str:
        if self.strategy is not None:
            return self.strategy
        return "data-parallel" if parse_target(self.target).chips > 1 else "as-captured"

    def check(self) -> None:
        target = parse_target(self.target)
        counts = supported_chip_counts(target.chip.key)
        if target.chips not in counts:
            choices = ", ".join(f"{target.chip.key}-{count}" if count > 1 else target.chip.key for count in counts)
            raise TpuAgentError(
                "unsupported-target",
                f"--chip {target.spec}: the TPU compiler has no {target.chip.key} slice of {target.chips} chips",
                f"use one of: {choices}" if counts else f"use a {', '.join(SLICE_GENERATIONS)} target",
            )
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise TpuAgentError(
                "bad-strategy",
                f"--strategy {self.strategy!r} is not a strategy",
                f"use one of: {', '.join(STRATEGIES)}",
            )
        if self.effort not in EFFORTS:
            raise TpuAgentError(
                "bad-effort", f"--effort {self.effort!r} is not an effort", f"use one of: {', '.join(EFFORTS)}"
            )
        if not MIN_OPTIMIZER_STEPS <= self.steps <= MAX_OPTIMIZER_STEPS:
            raise TpuAgentError(
                "bad-steps",
                f"--steps {self.steps}: the capture needs {MIN_OPTIMIZER_STEPS} to {MAX_OPTIMIZER_STEPS} optimizer "
                "steps",
                f"use --steps {DEFAULT_OPTIMIZER_STEPS}",
            )


@dataclass
class ScriptEstimate:
    """The estimate document (``to_dict`` of a CompiledEstimate plus schema and script facts) and the script's exit."""

    document: dict[str, Any]
    exit_code: int

    @property
    def fits(self) -> bool:
        return self.document["estimate"]["verdict"] == "fits"


def run_failure(script: str, exit_code: int) -> TpuAgentError:
    """Why the script left no result: killed (the kernel's OOM killer sends SIGKILL), or exited with ``exit_code``."""
    if exit_code in _KILLED:
        return TpuAgentError(
            "script-killed",
            f"{script} was killed (SIGKILL, exit code {exit_code}) before a step could be captured: most likely the "
            "host ran out of memory (the kernel's OOM killer ends the largest process)",
            "estimate with --capture-only: the step is then recorded from shapes and nothing model-sized is "
            "allocated on this machine (or lower --host-memory, the bound at which estimate switches to it)",
            ExitCode.FINDINGS,
        )
    return TpuAgentError(
        "script-failed",
        f"{script} exited with code {exit_code} before a step could be captured",
        "run it with `tpu-agent run` first and fix the error above",
        ExitCode.FINDINGS,
    )


def estimate_script(
    target: Any, options: EstimateOptions, progress: Callable[[str], None] | None = None
) -> ScriptEstimate:
    """Run ``target`` (a :class:`tpu_agent.runtime.api.LaunchTarget`) and compile its steady step for
    ``options.target``. Raises :class:`TpuAgentError` when nothing could be estimated, with what to do."""
    from tpu_agent.runtime.api import RunOptions, launch
    from tpu_agent.runtime.envvars import HOOKS_ENV
    from tpu_agent.runtime.xla.settings import COMPILER_ENV, XLA, XLA_DEFERRED_ENV

    options.check()
    if not target.is_module and not Path(target.target).is_file():
        raise TpuAgentError("script-not-found", f"{target.target}: no such script", "pass the path of a Python script")
    status = require_compiler()
    strategy = options.resolved_strategy()
    with tempfile.TemporaryDirectory(prefix="tpu-agent-estimate-") as scratch:
        directory = Path(scratch)
        settings = {
            "target": options.target,
            "strategy": strategy,
            "effort": options.effort,
            "steps": options.steps,
            "suggest": options.suggest,
            "capture_only": options.capture_only,
            "allow_partial": options.allow_partial,
            "host_memory_bytes": options.host_memory_bytes or host_bound.default_bound_bytes(),
        }
        atomic_write_text(directory / OPTIONS_FILE, json.dumps(settings))
        hooks = ",".join(h for h in (os.environ.get(HOOKS_ENV, ""), HOOK_SPEC) if h)
        env = {
            COMPILER_ENV: XLA,
            XLA_DEFERRED_ENV: "1",  # DeferAndFuse graphs through XLA: the graphs the estimate compiles
            "JAX_PLATFORMS": "cpu",  # libtpu compiles for the target; nothing initialises it for execution
            "TPU_SKIP_MDS_QUERY": "1",
            ESTIMATE_DIR_ENV: str(directory),
            HOOKS_ENV: hooks,
            # one rank, as torchrun starts it: scripts that init a process group (DDP, FSDP2) run unchanged; the
            # store binds a free port itself (port 0), since no other rank ever connects
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "0",
        }
        if progress:
            progress(f"running {target.target} for {options.steps} steps and compiling for {options.target}")
        exit_code = launch(
            target,
            RunOptions(nproc=1, chip=options.target, eager_mode="defer-and-fuse", env=env, timeout_s=options.timeout_s),
        )
        result_path = directory / RESULT_FILE
        if not result_path.exists():
            raise run_failure(target.target, exit_code)
        result = json.loads(result_path.read_text())
    if not result.get("ok"):
        error = result.get("error", {})
        exit_code = error.get("exit_code")
        raise TpuAgentError(
            str(error.get("code", "estimate-failed")),
            str(error.get("message", "no estimate")),
            str(error.get("hint", "")),
            ExitCode(exit_code) if exit_code in set(ExitCode) else ExitCode.USAGE,
        )
    document = {
        "schema_version": SCHEMA_VERSION,
        "script": target.target,
        "steps_watched": result.get("steps_watched"),
        "capture_only": options.capture_only,
        "capture_only_chosen": result.get("capture_only_chosen"),
        "libtpu_version": status.libtpu_version,
        "estimate": result["estimate"],
    }
    return ScriptEstimate(document, exit_code)
