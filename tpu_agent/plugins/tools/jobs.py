"""The job tools: run, profile or estimate a workspace script as a job, poll it, cancel it.

``tpu_run``, ``tpu_profile`` and ``tpu_estimate`` are one implementation, :func:`_start_job`, over the same
``tpu-agent run``, ``profile`` and ``estimate`` commands a person types; they differ only in the command's own
options. The
server's limits apply here: ranks per job (``--max-ranks``) before anything starts, concurrent jobs
(``--max-jobs``) in the job manager, which answers ``busy`` with the running job ids.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context
from pydantic import Field

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.estimate.options import (
    DEFAULT_EFFORT,
    DEFAULT_OPTIMIZER_STEPS,
    DEFAULT_TARGET,
    MAX_OPTIMIZER_STEPS,
    MIN_OPTIMIZER_STEPS,
)
from tpu_agent.plugins import models
from tpu_agent.plugins.jobs import Job, JobManager, JobState, new_job_id
from tpu_agent.plugins.tools.args import (
    BackendArg,
    ChipArg,
    CompilerArg,
    EagerModeArg,
    EffortArg,
    EntrypointArg,
    JobIdArg,
    NprocArg,
    ScriptArgsArg,
    StrategyArg,
    TimeoutArg,
    WaitArg,
    WorkspaceArg,
)
from tpu_agent.plugins.tools.common import URI_SCHEME, ToolSpec, in_thread, server_state, tool_hints
from tpu_agent.plugins.workspace import Workspace
from tpu_agent.profile.options import DEFAULT_STEPS, DEFAULT_WARMUP, MAX_STEPS, MAX_WARMUP

POLL_S = 0.5


def job_result(job: Job, log_lines: int = 30) -> models.JobResult:
    ws = job.workspace
    estimate = _estimate_file(job)
    check = report_file(job, "check", CHECK_FILE)
    if job.state.value == "running":
        next_action = f"Call tpu_job_status with job_id={job.id!r} and wait_s=30 until the state is final."
    elif job.kind == "profile" and job.state.value == "succeeded":
        next_action = f"Call tpu_diagnose with job_id={job.id!r}."
    elif estimate is not None and job.exit_code in (ExitCode.OK, ExitCode.FINDINGS):
        next_action = (
            f"Read {ws.relative(estimate)}: the verdict, HBM per chip and, when it does not fit, the "
            "suggestions (each compiled). Apply one, then call tpu_estimate again."
        )
    elif check is not None and job.exit_code in (ExitCode.OK, ExitCode.FINDINGS):
        next_action = (
            f"Read {ws.relative(check)}: 'status' per mode (pass / mismatch / error) and, for a failing mode, "
            "'localisation': the first diverging submodule and the op inside it. Fix that, then check again."
        )
    elif job.state.value == "succeeded":
        next_action = "Done. Call tpu_profile with the same entrypoint to find what limits the step time."
    else:
        next_action = "Read log_tail (or the log resource) for the cause, fix it, and start a new job."
    return models.JobResult(
        job_id=job.id,
        kind=job.kind,  # type: ignore[arg-type]  # "run" | "profile" | "estimate" | "check", set by the tools only
        state=job.state.value,
        exit_code=job.exit_code,
        elapsed_s=round(job.elapsed_s, 2),
        command=job.argv,
        log_path=ws.relative(job.log_path),
        log_uri=f"{URI_SCHEME}://jobs/{job.id}/log",
        log_tail=job.log_tail(log_lines),
        log_truncated=job.log_truncated,
        profile_dir=ws.relative(job.artefact_dir) if job.artefact_dir is not None and job.kind == "profile" else None,
        estimate_path=ws.relative(estimate) if estimate is not None else None,
        check_path=ws.relative(check) if check is not None else None,
        next_action=next_action,
    )


ESTIMATE_FILE = "estimate.json"
CHECK_FILE = "check.json"


def report_file(job: Job, kind: str, name: str) -> Path | None:
    """The report a ``kind`` job wrote into its artefact directory (the commands' ``--output`` writes it
    atomically at the end), or None while it is not there."""
    if job.kind != kind or job.artefact_dir is None:
        return None
    path = job.artefact_dir / name
    return path if path.is_file() else None


def _estimate_file(job: Job) -> Path | None:
    return report_file(job, "estimate", ESTIMATE_FILE)


async def wait_for_job(ctx: Context, job: Job, wait_s: float) -> None:
    """Wait up to ``wait_s`` for the job, sending progress (seconds elapsed, last log line) meanwhile."""
    deadline = anyio.current_time() + wait_s
    reported = -1.0
    while not job.done and anyio.current_time() < deadline:
        await anyio.sleep(POLL_S)
        elapsed = round(job.elapsed_s, 1)
        if elapsed > reported:
            reported = elapsed
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await ctx.report_progress(elapsed, job.timeout_s, job.last_line())
    if job.done:  # the exit is recorded only after the log is fully drained
        await in_thread(lambda: JobManager.wait_exit(job, 5))


def _entrypoint(ws: Workspace, entrypoint: str) -> Path:
    path = ws.resolve(entrypoint)
    if not path.is_file() or path.suffix != ".py":
        raise TpuAgentError(
            "bad-entrypoint",
            f"entrypoint {ws.relative(path)!r} is not a Python file in the workspace",
            "Pass the training script relative to the workspace, e.g. entrypoint='train.py'.",
        )
    return path


def _judge_profile(job: Job) -> JobState | None:
    """``tpu-agent profile`` exits 1 both for error-level findings and for a failing script: the report's
    ``capture.exit_code`` (the script's own) tells them apart."""
    if job.exit_code != ExitCode.FINDINGS or job.artefact_dir is None:
        return None
    from tpu_agent.profile.layout import REPORT_DIR

    report = job.artefact_dir / REPORT_DIR / "report.json"
    try:
        script_exit = json.loads(report.read_text(encoding="utf-8"))["capture"]["exit_code"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return JobState.SUCCEEDED if script_exit == 0 else JobState.FAILED


def _judge_estimate(job: Job) -> JobState | None:
    """``tpu-agent estimate`` exits 1 when the step does not fit: with the estimate written, that is an answer."""
    if job.exit_code == ExitCode.FINDINGS and _estimate_file(job) is not None:
        return JobState.SUCCEEDED
    return None


async def _start_job(
    ctx: Context,
    kind: str,
    command_options: list[str],
    *,
    entrypoint: str,
    args: list[str],
    nproc: int | None,
    chip: str | None,
    eager_mode: str | None,
    compiler: str | None,
    timeout_s: int,
    wait_s: int,
    workspace: str | None,
) -> models.JobResult:
    """Start ``tpu-agent <kind> <command_options> <shared options> SCRIPT ARGS`` as a job and wait a while.

    A profile job gets its own capture directory, ``.tpu-agent/profiles/<job_id>``, passed as ``--logdir``; an
    estimate job writes ``.tpu-agent/estimates/<job_id>/estimate.json``. ``nproc`` None: the command runs one
    rank by design (estimate).
    """
    state = server_state(ctx)
    if nproc is not None and nproc > state.max_ranks:
        raise TpuAgentError(
            "too-many-ranks",
            f"nproc={nproc} is more ranks than this server starts for one job (at most {state.max_ranks})",
            f"Pass nproc <= {state.max_ranks}, or restart the server with `tpu-agent mcp --max-ranks N`.",
            ExitCode.REFUSED,
        )
    ws = await state.workspace(ctx, workspace)
    script = _entrypoint(ws, entrypoint)
    job_id = new_job_id(kind)
    argv = [sys.executable, "-m", "tpu_agent", kind, *command_options]
    if chip:  # unnamed: the command's default chip, whose hosts take any nproc (a named one is checked)
        argv += ["--chip", chip]
    if nproc is not None:
        argv += ["--nproc", str(nproc)]
    if eager_mode:
        argv += ["--eager-mode", eager_mode]
    if compiler:
        argv += ["--compiler", compiler]
    logdir = None
    if kind == "profile":
        logdir = ws.artefact_dir("profiles", job_id, fresh=True)
        argv += ["--logdir", ws.relative(logdir)]
    elif kind == "estimate":
        logdir = ws.artefact_dir("estimates", job_id, fresh=True)
        argv += ["--format", "json", "--output", ws.relative(logdir / ESTIMATE_FILE)]
    argv += ["--", ws.relative(script), *args]  # a script named like an option ("--env=X=1.py") stays the script
    try:
        job = state.jobs.start(
            kind,
            argv,
            ws,
            timeout_s=timeout_s,
            artefact_dir=logdir,
            job_id=job_id,
            judge={"profile": _judge_profile, "estimate": _judge_estimate}.get(kind),
        )
    except TpuAgentError:
        if logdir is not None:  # refused (busy): no empty capture for tpu_diagnose to pick as the newest
            logdir.rmdir()
        raise
    await wait_for_job(ctx, job, wait_s)
    return job_result(job)


async def tpu_run(
    ctx: Context,
    entrypoint: EntrypointArg,
    args: ScriptArgsArg = [],  # noqa: B006 - pydantic copies defaults
    nproc: NprocArg = 1,
    backend: BackendArg = "auto",
    chip: ChipArg = None,
    eager_mode: EagerModeArg = None,  # type: ignore[valid-type]  # a Literal built at run time (see args)
    compiler: CompilerArg = None,
    timeout_s: TimeoutArg = 1800,
    wait_s: WaitArg = 20,
    workspace: WorkspaceArg = None,
) -> models.JobResult:
    return await _start_job(
        ctx, "run", ["--backend", backend], entrypoint=entrypoint, args=args, nproc=nproc, chip=chip,
        eager_mode=eager_mode, compiler=compiler, timeout_s=timeout_s, wait_s=wait_s, workspace=workspace,
    )  # fmt: skip


async def tpu_profile(
    ctx: Context,
    entrypoint: EntrypointArg,
    args: ScriptArgsArg = [],  # noqa: B006 - pydantic copies defaults
    nproc: NprocArg = 1,
    steps: Annotated[
        int, Field(ge=1, le=MAX_STEPS, description="Steps to measure, after the warm-up.")
    ] = DEFAULT_STEPS,
    warmup: Annotated[
        int, Field(ge=0, le=MAX_WARMUP, description="Steps run before measuring (compiles).")
    ] = DEFAULT_WARMUP,
    chip: ChipArg = None,
    eager_mode: EagerModeArg = None,  # type: ignore[valid-type]  # a Literal built at run time (see args)
    compiler: CompilerArg = None,
    verify: Annotated[
        bool | None,
        Field(
            description="Check each finding's diff on a copy of the workspace script before offering it (one short "
            "run per diff); false leaves the diffs marked unverified; default: the server's (verify unless "
            "TPU_AGENT_PROFILE_VERIFY=0)."
        ),
    ] = None,
    timeout_s: TimeoutArg = 1800,
    wait_s: WaitArg = 20,
    workspace: WorkspaceArg = None,
) -> models.JobResult:
    options = ["--steps", str(steps), "--warmup", str(warmup)]
    options += [] if verify is None else ["--verify" if verify else "--no-verify"]
    return await _start_job(
        ctx, "profile", options, entrypoint=entrypoint, args=args,
        nproc=nproc, chip=chip, eager_mode=eager_mode, compiler=compiler, timeout_s=timeout_s, wait_s=wait_s,
        workspace=workspace,
    )  # fmt: skip


async def tpu_estimate(
    ctx: Context,
    entrypoint: EntrypointArg,
    args: ScriptArgsArg = [],  # noqa: B006 - pydantic copies defaults
    chip: ChipArg = DEFAULT_TARGET,
    strategy: StrategyArg = None,
    steps: Annotated[
        int,
        Field(
            ge=MIN_OPTIMIZER_STEPS,
            le=MAX_OPTIMIZER_STEPS,
            description="Optimizer steps to run; the last full one is compiled.",
        ),
    ] = DEFAULT_OPTIMIZER_STEPS,
    capture_only: Annotated[
        bool,
        Field(
            description="Record the step's shapes without computing them (host reads return placeholders), for "
            "models bigger than this machine (estimate also switches to it by itself past its host-memory bound)."
        ),
    ] = False,
    allow_partial: Annotated[
        bool,
        Field(
            description="When a graph of the step cannot be compiled, still report the rest, each figure marked "
            "with the share of the step's ops it covers (default: no verdict from part of a step)."
        ),
    ] = False,
    effort: EffortArg = DEFAULT_EFFORT,
    timeout_s: TimeoutArg = 1800,
    wait_s: WaitArg = 20,
    workspace: WorkspaceArg = None,
) -> models.JobResult:
    options = ["--steps", str(steps), "--effort", effort] + (["--strategy", strategy] if strategy else [])
    options += ["--capture-only"] if capture_only else []
    options += ["--allow-partial"] if allow_partial else []
    return await _start_job(
        ctx, "estimate", options, entrypoint=entrypoint, args=args, nproc=None, chip=chip,
        eager_mode=None, compiler=None, timeout_s=timeout_s, wait_s=wait_s, workspace=workspace,
    )  # fmt: skip


async def tpu_job_status(
    ctx: Context,
    job_id: JobIdArg,
    wait_s: WaitArg = 0,
    log_lines: Annotated[int, Field(ge=0, le=200)] = 30,
) -> models.JobResult:
    job = server_state(ctx).jobs.get(job_id)
    await wait_for_job(ctx, job, wait_s)
    return job_result(job, log_lines)


async def tpu_job_cancel(
    ctx: Context, job_id: Annotated[JobIdArg, Field(description="The job to stop.")]
) -> models.CancelResult:
    jobs = server_state(ctx).jobs
    job, was_running = await in_thread(lambda: jobs.cancel(job_id))
    return models.CancelResult(job_id=job.id, state=job.state.value, was_running=was_running)


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        tpu_run,
        "tpu_run",
        "Run a workspace Python script on the TPU device (real torch_tpu when present, else the CPU emulation) "
        "as a job, via `tpu-agent run`. Waits up to wait_s, then returns the job state, exit code and the log's "
        "last lines; poll a running job with tpu_job_status, stop it with tpu_job_cancel. The server runs a "
        "few jobs at a time and answers busy (with the running job ids) beyond that.",
        tool_hints("Run a script on TPU", read_only=False, idempotent=False),
    ),
    ToolSpec(
        tpu_profile,
        "tpu_profile",
        "Profile a workspace script on the TPU device as a job, via `tpu-agent profile`; the capture "
        "(XProf-viewable) goes under .tpu-agent/profiles/<job_id>/. Waits up to wait_s; poll with "
        "tpu_job_status; then call tpu_diagnose with the job_id.",
        tool_hints("Profile a script on TPU", read_only=False, idempotent=False),
    ),
    ToolSpec(
        tpu_estimate,
        "tpu_estimate",
        "Estimate a workspace training script on a TPU slice without a TPU, as a job, via `tpu-agent estimate`: "
        "runs a few steps on the emulated device, compiles the step with the TPU compiler (libtpu) for chip "
        "(v5e, v5e-4, v6e-8, ...) and writes .tpu-agent/estimates/<job_id>/estimate.json: HBM per chip vs the "
        "chip's (fits / does not fit), compiler FLOPs and step time, MFU, collectives, and when it does not fit "
        "the compiled fixes. Exit code 1 means it does not fit. Poll with tpu_job_status.",
        tool_hints("Estimate a script on a TPU slice", read_only=False, idempotent=False),
    ),
    ToolSpec(
        tpu_job_status,
        "tpu_job_status",
        "State, exit code and last log lines of a job from tpu_run, tpu_profile, tpu_estimate or tpu_check. wait_s > 0 "
        "waits (with progress) up to that long for the job to finish.",
        tool_hints("Job status", read_only=True),
    ),
    ToolSpec(
        tpu_job_cancel,
        "tpu_job_cancel",
        "Stop a job (every process it started). Cancelling a finished job changes nothing.",
        tool_hints("Cancel a job", read_only=False, destructive=True),
    ),
)

__all__ = [
    "CHECK_FILE",
    "TOOLS",
    "job_result",
    "report_file",
    "tpu_estimate",
    "tpu_job_cancel",
    "tpu_job_status",
    "tpu_profile",
    "tpu_run",
    "wait_for_job",
]
