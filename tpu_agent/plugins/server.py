"""``tpu-agent mcp``: the MCP server that exposes migrate, run, profile and diagnose to coding agents.

Built on the official ``mcp`` SDK 2.x (``MCPServer``). Every tool is a thin wrapper over a public API
(``tpu_agent.migrate.api``, ``tpu_agent.runtime.api``, ``tpu_agent.profile.api``); runs and profiles go
through the same ``tpu-agent run|profile`` commands a person types, as jobs. Tools take workspace-relative
paths, return pydantic models (published output schemas, structured content), and fail with
``TpuAgentError``'s code, message and hint so an agent knows what to do next. The heavy APIs are imported
inside the tools, so the server answers ``tools/list`` without importing torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import platform
import shutil
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlparse
from urllib.request import url2pathname

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.types import ToolAnnotations
from pydantic import Field

from tpu_agent import __version__
from tpu_agent.chips import CLI_CHIPS, DEFAULT_CHIP
from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.plugins import api_lookup, models
from tpu_agent.plugins.bundles import load_skill_body
from tpu_agent.plugins.jobs import Job, JobManager, JobState
from tpu_agent.plugins.plans import in_workspace_terms, load_plan, save_plan
from tpu_agent.plugins.workspace import Workspace, resolve_workspace
from tpu_agent.runtime.envvars import EAGER_MODES
from tpu_agent.runtime.select import BACKENDS

logger = logging.getLogger("tpu_agent.mcp")

SERVER_NAME = "tpu-agent"
URI_SCHEME = "tpu-agent"
#: Hosts cut tool calls off (Codex: 60 s by default); job tools return within this and hand back a job id.
MAX_WAIT_S = 50
POLL_S = 0.5

INSTRUCTIONS = """\
tpu-agent moves CUDA PyTorch code onto Google TPUs (TorchTPU) and tunes it.
Workflow: tpu_scan -> tpu_plan_migration (shows a unified diff, touches nothing) -> show the diff to the
user and wait for approval -> tpu_apply_plan -> tpu_run (a job; poll tpu_job_status) -> tpu_profile ->
tpu_diagnose -> edit the code per each finding's suggested_change -> run/profile again.
Paths are relative to the workspace (the project directory). If a tool says no-workspace, pass
workspace='/abs/path/to/repo'. Errors start with a stable code and end with a hint saying what to do.
"""

WorkspaceArg = Annotated[
    str | None,
    Field(
        description="Absolute path of the project directory. Defaults to the server's --workspace, the "
        "host's project directory (CLAUDE_PROJECT_DIR), or the client's first MCP root."
    ),
]
PathsArg = Annotated[
    list[str],
    Field(min_length=1, max_length=200, description="Files or directories, relative to the workspace."),
]
# The script a run/profile job launches, as `tpu-agent run` and `tpu-agent profile` take it.
EntrypointArg = Annotated[str, Field(description="Workspace-relative .py script, e.g. 'train.py'.")]
ScriptArgsArg = Annotated[list[str], Field(max_length=200, description="Script arguments, passed verbatim.")]
NprocArg = Annotated[int, Field(ge=1, le=64, description="Processes (ranks) on this host.")]
# The runtime's own choice lists, so the schemas offer exactly what `tpu-agent run` accepts.
BackendArg = Annotated[
    Literal[BACKENDS],  # type: ignore[valid-type]
    Field(description="auto: real torch_tpu when it sees a TPU, else the CPU emulation of the tpu device."),
]
ChipArg = Annotated[Literal[CLI_CHIPS], Field(description="TPU generation the emulation presents.")]  # type: ignore[valid-type]
EagerModeArg = Annotated[
    Literal[tuple(EAGER_MODES)] | None,  # type: ignore[valid-type]
    Field(description="TorchTPU eager mode (default: the environment's, else strict)."),
]
RuleCodes = Annotated[
    list[str] | None,
    Field(description="Rule codes or code prefixes (e.g. ['TPU1']); default: every rule."),
]

T = TypeVar("T")


def format_error(error: TpuAgentError) -> str:
    """What the agent reads for a refused call: code, what happened, what to do, and a JSON copy."""
    text = f"{error.code}: {error.message}"
    if error.hint:
        text += f"\nHint: {error.hint}"
    return text + "\n" + json.dumps({"error": error.to_dict()})


def tool_errors(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Turn :class:`TpuAgentError` (and crashes in the wrapped APIs) into ``is_error`` tool results."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except TpuAgentError as error:
            raise ToolError(format_error(error)) from error
        except (ToolError, ResourceError):
            raise
        except Exception as error:  # a bug below us: tell the agent what broke instead of a bare failure
            logger.exception("tool %s crashed", fn.__name__)
            internal = TpuAgentError(
                "internal-error",
                f"{type(error).__name__}: {error}",
                "This is a tpu-agent bug; the server's stderr has the traceback. Retrying will not help.",
                ExitCode.INTERNAL,
            )
            raise ToolError(format_error(internal)) from error

    return wrapper


@dataclass
class ServerState:
    """What one server process holds: the configured workspace and the jobs it started."""

    configured_workspace: str | None
    jobs: JobManager = field(default_factory=JobManager)

    async def workspace(self, ctx: Context, argument: str | None) -> Workspace:
        """The workspace for one call; when nothing names it, the client's MCP roots as a last resort.

        Roots exist only on handshake-era (2025-11-25) connections whose client advertises them (VS Code,
        Cursor and Copilot load Agent Plugins with the plugin directory as cwd and no project variable).
        """
        try:
            return resolve_workspace(argument, self.configured_workspace)
        except TpuAgentError as error:
            if error.code != "no-workspace":
                raise
            root = await _first_root(ctx)
            if root is None:
                raise
            return dataclasses.replace(resolve_workspace(root, None), source="roots")


async def _first_root(ctx: Context) -> str | None:
    """The first ``file://`` root the client lists, or None when it has no roots (or no back-channel)."""
    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.roots is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            result = await ctx.session.list_roots()
    except MCPError as error:  # NoBackChannelError on 2026 connections, or the client refused
        logger.info("roots/list failed: %r", error)
        return None
    for root in result.roots:
        uri = str(root.uri)
        if uri.startswith("file://"):
            return url2pathname(urlparse(uri).path)
    return None


async def _in_thread(func: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(func)


def _progress_relay(ctx: Context) -> Callable[[int, int], None]:
    """A sync ``progress(done, total)`` for the APIs, forwarding increasing values as MCP progress."""
    last = [-1]

    def relay(done: int, total: int) -> None:
        if done <= last[0]:
            return
        last[0] = done
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
            anyio.from_thread.run(ctx.report_progress, float(done), float(total), f"{done}/{total} files")

    return relay


def _read_only(title: str) -> ToolAnnotations:
    return ToolAnnotations(
        title=title, read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    )


def _job_result(job: Job, log_lines: int = 30) -> models.JobResult:
    ws = job.workspace
    if job.state.value == "running":
        next_action = f"Call tpu_job_status with job_id={job.id!r} and wait_s=30 until the state is final."
    elif job.kind == "profile" and job.state.value == "succeeded":
        next_action = f"Call tpu_diagnose with job_id={job.id!r}."
    elif job.state.value == "succeeded":
        next_action = "Done. Call tpu_profile with the same entrypoint to find what limits the step time."
    else:
        next_action = "Read log_tail (or the log resource) for the cause, fix it, and start a new job."
    return models.JobResult(
        job_id=job.id,
        kind=job.kind,  # type: ignore[arg-type]
        state=job.state.value,
        exit_code=job.exit_code,
        elapsed_s=round(job.elapsed_s, 2),
        command=job.argv,
        log_path=ws.relative(job.log_path),
        log_uri=f"{URI_SCHEME}://jobs/{job.id}/log",
        log_tail=job.log_tail(log_lines),
        log_truncated=job.log_truncated,
        profile_dir=ws.relative(job.artefact_dir) if job.artefact_dir is not None else None,
        next_action=next_action,
    )


async def _wait_for_job(ctx: Context, job: Job, wait_s: float) -> None:
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
        await _in_thread(lambda: JobManager.wait_exit(job, 5))


def _entrypoint(ws: Workspace, entrypoint: str) -> Path:
    path = ws.resolve(entrypoint)
    if not path.is_file() or path.suffix != ".py":
        raise TpuAgentError(
            "bad-entrypoint",
            f"entrypoint {entrypoint!r} is not a Python file in the workspace",
            "Pass the training script relative to the workspace, e.g. entrypoint='train.py'.",
        )
    return path


def _launch_options(nproc: int, chip: str, eager_mode: str | None) -> list[str]:
    """The ``tpu-agent run``/``profile`` options both job tools share."""
    argv = ["--nproc", str(nproc), "--chip", chip]
    if eager_mode:
        argv += ["--eager-mode", eager_mode]
    return argv


def _judge_profile(job: Job) -> JobState | None:
    """``tpu-agent profile`` exits 1 both for error-level findings and for a failing script: the report's
    ``capture.exit_code`` (the script's own) tells them apart."""
    if job.exit_code != ExitCode.FINDINGS or job.artefact_dir is None:
        return None
    from tpu_agent.profile.load import REPORT_DIR

    report = job.artefact_dir / REPORT_DIR / "report.json"
    try:
        script_exit = json.loads(report.read_text(encoding="utf-8"))["capture"]["exit_code"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return JobState.SUCCEEDED if script_exit == 0 else JobState.FAILED


def _finding_to_scan(finding: Any) -> models.ScanFinding:
    return models.ScanFinding(
        rule=finding.code,
        safety=finding.safety.value,
        location=models.Location(path=finding.path, line=max(1, finding.line), column=max(1, finding.column)),
        message=finding.message,
        fixed=finding.fixed,
    )


def _plan_findings(plan: Any) -> list[models.ScanFinding]:
    out = [_finding_to_scan(finding) for finding in plan.findings]
    return sorted(out, key=lambda f: (f.location.path, f.location.line, f.location.column, f.rule))


def _migrate_options(
    select: list[str] | None, ignore: list[str] | None, unsafe_fixes: bool, target: str
) -> Any:
    from tpu_agent.migrate.model import MigrateOptions, Target

    return MigrateOptions(
        select=frozenset(select) if select else None,
        ignore=frozenset(ignore or ()),
        unsafe_fixes=unsafe_fixes,
        target=Target(target),
    )


async def _build_plan(ctx: Context, ws: Workspace, paths: Sequence[str], options: Any) -> Any:
    targets = [ws.resolve(p) for p in paths]
    from tpu_agent.migrate import api as migrate_api

    relay = _progress_relay(ctx)
    plan = await _in_thread(lambda: migrate_api.plan(targets, options, progress=relay))
    return in_workspace_terms(plan, ws)


def _profile_dir_of(state: ServerState, ws: Workspace, job_id: str | None, logdir: str | None) -> Path:
    if job_id:
        job = state.jobs.get(job_id)
        if job.artefact_dir is None:
            raise TpuAgentError(
                "not-a-profile-job",
                f"job {job_id!r} is a {job.kind} job and has no profile",
                "Call tpu_profile first, then pass its job_id.",
            )
        if not job.done:
            raise TpuAgentError(
                "job-running",
                f"profile job {job_id!r} is still running ({job.elapsed_s:.0f} s so far)",
                f"Call tpu_job_status with job_id={job_id!r} and wait_s=30 until it finishes, then diagnose.",
            )
        return job.artefact_dir
    if logdir:
        return ws.resolve(logdir, for_write=True)  # diagnosing writes reports next to the capture
    profiles = ws.artefacts / "profiles"
    candidates = sorted((p for p in profiles.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise TpuAgentError(
            "no-profile",
            f"no profile under {ws.relative(profiles)}/ in the workspace",
            "Call tpu_profile (and wait for it with tpu_job_status), or pass logdir=.",
        )
    return candidates[-1]


def _item_from_finding(data: dict[str, Any], ws: Workspace) -> models.DiagnosticItem:
    """Map one profile finding (``tpu_agent.profile.model.Finding.to_dict()``) onto the tool's item."""
    change = data.get("agent_change") or {}
    return models.DiagnosticItem(
        rule=data["rule_id"],
        name=data["name"],
        category=data["category"],
        severity=data["severity"],
        title=data["title"],
        suggested_change=data["suggestion"],
        agent_change=change.get("description"),
        agent_diff=change.get("diff"),
        locations=[f"{ws.relative(Path(loc['file']))}:{loc['line']}" for loc in data["locations"]],
        estimated_saving_pct=data["estimated_saving_pct"],
        detail=data,
    )


def build_server(workspace: str | None = None, *, log_level: str = "WARNING") -> MCPServer:
    """The ``tpu-agent`` MCP server; ``workspace`` is the ``--workspace`` default for every call."""
    state = ServerState(configured_workspace=workspace)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[ServerState]:
        try:
            yield state
        finally:
            state.jobs.shutdown()

    server = MCPServer(
        SERVER_NAME,
        title="tpu-agent",
        description="Move CUDA PyTorch code onto Google TPUs through TorchTPU, then run, profile and tune it.",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level=log_level,  # type: ignore[arg-type]
        lifespan=lifespan,
    )
    server.state = state  # type: ignore[attr-defined]  # tests and the CLI reach the job manager here

    @server.tool(
        name="tpu_doctor",
        description="Check the environment: tpu-agent and Python versions, the workspace the tools will use "
        "(and where it came from), and the runtime's backend choice (real torch_tpu or the CPU emulation). "
        "Call it first; it never fails, it lists problems with hints instead.",
        annotations=_read_only("Check the TPU environment"),
    )
    @tool_errors
    async def tpu_doctor(ctx: Context, workspace: WorkspaceArg = None) -> models.DoctorResult:
        problems: list[models.Problem] = []
        ws: Workspace | None = None
        try:
            ws = await state.workspace(ctx, workspace)
        except TpuAgentError as error:
            problems.append(models.Problem(**error.to_dict()))
        runtime: dict[str, Any] = {}
        try:
            from tpu_agent.runtime import api as runtime_api

            runtime = (await _in_thread(runtime_api.doctor)).to_dict()
        except TpuAgentError as error:
            problems.append(models.Problem(**error.to_dict()))
        if shutil.which("tpu-agent") is None:
            problems.append(
                models.Problem(
                    code="cli-not-on-path",
                    message="the tpu-agent command is not on PATH",
                    hint=f'Install it where your host looks: pip install "tpu-agent=={__version__}".',
                )
            )
        return models.DoctorResult(
            tpu_agent_version=__version__,
            python=f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
            workspace=str(ws.root) if ws else None,
            workspace_source=ws.source if ws else None,
            runtime=runtime,
            problems=problems,
        )

    @server.tool(
        name="tpu_scan",
        description="Find CUDA-specific code (devices, torch.cuda calls, AMP, NCCL, cuDNN flags, env vars, "
        "kernels) in workspace files. Returns findings with rule code, location and message; changes nothing. "
        "Next: tpu_plan_migration with the same paths.",
        annotations=_read_only("Scan for CUDA code"),
    )
    @tool_errors
    async def tpu_scan(
        ctx: Context,
        paths: PathsArg = ["."],  # noqa: B006 - pydantic copies defaults
        select: RuleCodes = None,
        max_findings: Annotated[int, Field(ge=1, le=2000, description="Cap on returned findings.")] = 200,
        workspace: WorkspaceArg = None,
    ) -> models.ScanResult:
        ws = await state.workspace(ctx, workspace)
        plan = await _build_plan(ctx, ws, paths, _migrate_options(select, None, False, "accelerator"))
        findings = _plan_findings(plan)
        counts: dict[str, int] = {}
        for finding in findings:
            counts[finding.rule] = counts.get(finding.rule, 0) + 1
        return models.ScanResult(
            workspace=str(ws.root),
            files_scanned=len(plan.files),
            files_with_findings=sum(1 for r in plan.files if r.findings),
            findings=findings[:max_findings],
            rule_counts=dict(sorted(counts.items())),
            truncated=len(findings) > max_findings,
            skipped=[f"{ws.relative(r.path)}: {r.skipped_reason}" for r in plan.files if r.skipped_reason],
        )

    @server.tool(
        name="tpu_plan_migration",
        description="Plan the CUDA -> TorchTPU rewrite of workspace files: returns a plan_id, a unified diff "
        "and a Markdown report, and records each file's sha256. Touches no source file (the plan is stored "
        "under .tpu-agent/plans/). Show the diff to the user and wait for approval before tpu_apply_plan.",
        annotations=ToolAnnotations(
            title="Plan a CUDA -> TPU migration",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    @tool_errors
    async def tpu_plan_migration(
        ctx: Context,
        paths: PathsArg = ["."],  # noqa: B006
        select: RuleCodes = None,
        ignore: RuleCodes = None,
        unsafe_fixes: Annotated[
            bool, Field(description="Also apply rewrites that rest on a stated assumption (rule safety 'unsafe').")
        ] = False,
        target: Annotated[
            Literal["accelerator", "tpu"],
            Field(description="accelerator: device-agnostic torch.accelerator code; tpu: literal 'tpu' forms."),
        ] = "accelerator",
        max_diff_chars: Annotated[int, Field(ge=1000, le=400_000)] = 60_000,
        workspace: WorkspaceArg = None,
    ) -> models.PlanResult:
        ws = await state.workspace(ctx, workspace)
        plan = await _build_plan(ctx, ws, paths, _migrate_options(select, ignore, unsafe_fixes, target))
        stored = await _in_thread(lambda: save_plan(plan, ws))
        from tpu_agent.migrate import model as migrate_model
        from tpu_agent.migrate import report as migrate_report

        changed = [
            models.ChangedFile(
                path=ws.relative(r.path),
                sha256_before=r.original_sha256,
                sha256_after=migrate_model.sha256_bytes(r.migrated_bytes or b""),
                fixes=r.converted_references,
            )
            for r in sorted(plan.changed_files, key=lambda r: ws.relative(r.path))
        ]
        report = migrate_report.render(plan, "markdown")
        return models.PlanResult(
            plan_id=stored.id,
            plan_path=ws.relative(stored.path),
            diff_uri=f"{URI_SCHEME}://plans/{stored.id}/diff",
            files_changed=changed,
            file_hashes={c.path: c.sha256_before for c in changed},
            diff=stored.diff[:max_diff_chars],
            diff_truncated=len(stored.diff) > max_diff_chars,
            report=report[:max_diff_chars],
            manual_followups=[f for f in _plan_findings(plan) if not f.fixed],
            next_action=(
                f"Show the diff to the user; after they approve, call tpu_apply_plan with plan_id={stored.id!r}."
                if changed
                else "Nothing to rewrite; work through manual_followups, then tpu_run."
            ),
        )

    @server.tool(
        name="tpu_apply_plan",
        description="Write a plan from tpu_plan_migration to the workspace (atomic writes). Refuses with "
        "stale-plan when a file changed since planning (plan again) and dirty-worktree when a file has "
        "uncommitted git changes; applying the same plan twice is a no-op. Only call after the user "
        "approved the diff.",
        annotations=ToolAnnotations(
            title="Apply a migration plan",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    @tool_errors
    async def tpu_apply_plan(
        ctx: Context,
        plan_id: Annotated[str, Field(description="The plan_id tpu_plan_migration returned.")],
        allow_dirty: Annotated[
            bool,
            Field(description="Rewrite files that have uncommitted git changes (refused by default: "
            "the user could not review or undo the rewrite with git)."),
        ] = False,
        workspace: WorkspaceArg = None,
    ) -> models.ApplyResult:
        ws = await state.workspace(ctx, workspace)
        stored = load_plan(plan_id, ws)
        from tpu_agent.migrate import api as migrate_api

        try:
            result = await _in_thread(lambda: migrate_api.apply(stored.plan, allow_dirty=allow_dirty))
        except TpuAgentError as error:
            if error.code == "dirty-worktree":  # the API's hint names the CLI flag; say it in tool terms
                error = dataclasses.replace(
                    error,
                    hint="Ask the user to commit (or stash) those files so the rewrite can be reviewed and undone "
                    "with git; only if they decline, call tpu_apply_plan again with allow_dirty=true.",
                )
            raise error from None
        written = sorted(ws.relative(p) for p in result.written)
        return models.ApplyResult(
            plan_id=plan_id,
            applied=bool(written),
            already_applied=not written and bool(stored.plan.changed_files),
            files_written=written,
            files_unchanged=sorted(ws.relative(p) for p in result.unchanged),
            next_action="Call tpu_run with the training script to check it runs on the tpu device.",
        )

    @server.tool(
        name="tpu_run",
        description="Run a workspace Python script on the TPU device (real torch_tpu when present, else the "
        "CPU emulation) as a job, via `tpu-agent run`. Waits up to wait_s, then returns the job state, exit "
        "code and the log's last lines; poll a running job with tpu_job_status, stop it with tpu_job_cancel.",
        annotations=ToolAnnotations(
            title="Run a script on TPU",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )
    @tool_errors
    async def tpu_run(
        ctx: Context,
        entrypoint: EntrypointArg,
        args: ScriptArgsArg = [],  # noqa: B006 - pydantic copies defaults
        nproc: NprocArg = 1,
        backend: BackendArg = "auto",
        chip: ChipArg = DEFAULT_CHIP,
        eager_mode: EagerModeArg = None,
        timeout_s: Annotated[int, Field(ge=1, le=86_400, description="The job is killed after this.")] = 1800,
        wait_s: Annotated[int, Field(ge=0, le=MAX_WAIT_S, description="How long this call waits.")] = 20,
        workspace: WorkspaceArg = None,
    ) -> models.JobResult:
        ws = await state.workspace(ctx, workspace)
        script = _entrypoint(ws, entrypoint)
        argv = [sys.executable, "-m", "tpu_agent", "run", "--backend", backend, *_launch_options(nproc, chip, eager_mode)]
        argv += [ws.relative(script), *args]
        job = state.jobs.start("run", argv, ws, timeout_s=timeout_s)
        await _wait_for_job(ctx, job, wait_s)
        return _job_result(job)

    @server.tool(
        name="tpu_profile",
        description="Profile a workspace script on the TPU device as a job, via `tpu-agent profile`; the "
        "capture (XProf-viewable) goes under .tpu-agent/profiles/<job_id>/. Waits up to wait_s; poll with "
        "tpu_job_status; then call tpu_diagnose with the job_id.",
        annotations=ToolAnnotations(
            title="Profile a script on TPU",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )
    @tool_errors
    async def tpu_profile(
        ctx: Context,
        entrypoint: EntrypointArg,
        args: ScriptArgsArg = [],  # noqa: B006 - pydantic copies defaults
        nproc: NprocArg = 1,
        steps: Annotated[int, Field(ge=1, le=10_000, description="Steps to measure, after the warm-up.")] = 10,
        warmup: Annotated[int, Field(ge=0, le=1_000, description="Steps run before measuring (compiles).")] = 2,
        chip: ChipArg = DEFAULT_CHIP,
        eager_mode: EagerModeArg = None,
        timeout_s: Annotated[int, Field(ge=1, le=86_400)] = 1800,
        wait_s: Annotated[int, Field(ge=0, le=MAX_WAIT_S)] = 20,
        workspace: WorkspaceArg = None,
    ) -> models.JobResult:
        ws = await state.workspace(ctx, workspace)
        script = _entrypoint(ws, entrypoint)
        from tpu_agent.plugins.jobs import new_job_id

        job_id = new_job_id("profile")
        logdir = ws.artefact_dir("profiles", job_id)
        argv = [sys.executable, "-m", "tpu_agent", "profile", *_launch_options(nproc, chip, eager_mode)]
        argv += ["--steps", str(steps), "--warmup", str(warmup), "--logdir", ws.relative(logdir)]
        argv += [ws.relative(script), *args]
        job = state.jobs.start(
            "profile", argv, ws, timeout_s=timeout_s, artefact_dir=logdir, job_id=job_id, judge=_judge_profile
        )
        await _wait_for_job(ctx, job, wait_s)
        return _job_result(job)

    @server.tool(
        name="tpu_job_status",
        description="State, exit code and last log lines of a job from tpu_run or tpu_profile. wait_s > 0 "
        "waits (with progress) up to that long for the job to finish.",
        annotations=_read_only("Job status"),
    )
    @tool_errors
    async def tpu_job_status(
        ctx: Context,
        job_id: Annotated[str, Field(description="The job_id tpu_run or tpu_profile returned.")],
        wait_s: Annotated[int, Field(ge=0, le=MAX_WAIT_S)] = 0,
        log_lines: Annotated[int, Field(ge=0, le=200)] = 30,
    ) -> models.JobResult:
        job = state.jobs.get(job_id)
        await _wait_for_job(ctx, job, wait_s)
        return _job_result(job, log_lines)

    @server.tool(
        name="tpu_job_cancel",
        description="Stop a job (every process it started). Cancelling a finished job changes nothing.",
        annotations=ToolAnnotations(
            title="Cancel a job",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    @tool_errors
    async def tpu_job_cancel(
        job_id: Annotated[str, Field(description="The job to stop.")],
    ) -> models.CancelResult:
        job, was_running = await _in_thread(lambda: state.jobs.cancel(job_id))
        return models.CancelResult(job_id=job.id, state=job.state.value, was_running=was_running)

    @server.tool(
        name="tpu_diagnose",
        description="Diagnose a profile: what limits the TPU step (host syncs, recompiles, eager flushes, "
        "fallbacks, input pipeline, precision, memory), each finding with its source location and the "
        "suggested change. Pass the job_id of a finished tpu_profile job, or a logdir; default: the newest "
        "profile in the workspace.",
        annotations=_read_only("Diagnose a TPU profile"),
    )
    @tool_errors
    async def tpu_diagnose(
        ctx: Context,
        job_id: Annotated[str | None, Field(description="A finished profile job.")] = None,
        logdir: Annotated[str | None, Field(description="Workspace-relative profile directory.")] = None,
        chip: Annotated[
            Literal[CLI_CHIPS] | None,  # type: ignore[valid-type]
            Field(description="Estimate for this TPU instead of the one the capture was made for."),
        ] = None,
        max_items: Annotated[int, Field(ge=1, le=100)] = 20,
        workspace: WorkspaceArg = None,
    ) -> models.DiagnoseResult:
        ws = await state.workspace(ctx, workspace)
        directory = _profile_dir_of(state, ws, job_id, logdir)
        from tpu_agent.profile import api as profile_api

        diagnosis = await _in_thread(lambda: profile_api.diagnose(directory, chip=chip))
        items = [_item_from_finding(f.to_dict(), ws) for f in diagnosis.findings]
        return models.DiagnoseResult(
            logdir=ws.relative(directory),
            chip=diagnosis.model.config.chip.key,
            findings=items[:max_items],
            truncated=len(items) > max_items,
            report=profile_api.render(diagnosis, "markdown")[:60_000],
            next_action=(
                "Apply each finding's suggested_change to the code, then tpu_profile again and compare."
                if items
                else "No findings: the step is not limited by anything the rules detect."
            ),
        )

    @server.tool(
        name="tpu_explain_rule",
        description="Explain a migration rule by code (e.g. TPU101): what it finds, why it matters on TPU, "
        "a before/after example, and its safety.",
        annotations=_read_only("Explain a migration rule"),
    )
    @tool_errors
    async def tpu_explain_rule(
        code: Annotated[str, Field(description="Rule code from a finding, e.g. 'TPU101'.")],
    ) -> models.RuleExplanation:
        from tpu_agent.migrate import rules

        return models.RuleExplanation.model_validate(rules.get_rule(code.strip().upper()).to_dict())

    @server.tool(
        name="tpu_lookup_api",
        description="Look up the TorchTPU equivalent of a CUDA PyTorch API (e.g. 'torch.cuda.synchronize', "
        "'GradScaler', 'nccl') in the bundled mapping table, with its status (works, rewrite, no-op, none, "
        "manual, unverified) and a note.",
        annotations=_read_only("CUDA -> TorchTPU API lookup"),
    )
    @tool_errors
    async def tpu_lookup_api(
        query: Annotated[str, Field(min_length=1, max_length=200, description="A CUDA API or idiom.")],
        limit: Annotated[int, Field(ge=1, le=20)] = 5,
    ) -> models.ApiLookupResult:
        legend, _ = api_lookup.load_table()
        matches = api_lookup.lookup(query, limit)
        return models.ApiLookupResult(
            query=query,
            matches=[
                models.ApiMappingItem(
                    cuda=m.cuda,
                    tpu=m.tpu,
                    status=m.status,
                    status_meaning=legend.get(m.status, ""),
                    note=m.note,
                    reference=m.reference,
                )
                for m in matches
            ],
        )

    _register_resources(server, state)
    _register_prompts(server)
    return server


def _resource_error(error: TpuAgentError) -> ResourceError:
    return ResourceError(format_error(error))


def _register_resources(server: MCPServer, state: ServerState) -> None:
    @server.resource(f"{URI_SCHEME}://rules", name="rules", mime_type="application/json", description="Every migration rule.")
    def rules_catalogue() -> str:
        from tpu_agent.migrate.rules import ALL_RULES

        return json.dumps([rule.to_dict() for _, rule in sorted(ALL_RULES.items())], indent=1)

    @server.resource(
        f"{URI_SCHEME}://plans/{{plan_id}}/diff", name="plan-diff", mime_type="text/x-diff", description="A plan's diff."
    )
    def plan_diff(plan_id: str) -> str:
        try:
            return load_plan(plan_id, resolve_workspace(None, state.configured_workspace)).diff
        except TpuAgentError as error:
            raise _resource_error(error) from error

    @server.resource(
        f"{URI_SCHEME}://jobs/{{job_id}}/log", name="job-log", mime_type="text/plain", description="A job's log (last 200 lines)."
    )
    def job_log(job_id: str) -> str:
        try:
            return "\n".join(state.jobs.get(job_id).log_tail(200)) + "\n"
        except TpuAgentError as error:
            raise _resource_error(error) from error


def _register_prompts(server: MCPServer) -> None:
    @server.prompt(name="migrate_to_tpu", title="Migrate this repo to TPU", description="Scan, plan, review, apply, run.")
    def migrate_to_tpu(path: str = ".") -> str:
        return f"Migrate `{path}` in this workspace from CUDA to TPU.\n\n" + load_skill_body("tpu-migrate")

    @server.prompt(name="why_is_my_tpu_step_slow", title="Why is my TPU step slow?", description="Profile, diagnose, fix.")
    def why_is_my_tpu_step_slow(entrypoint: str = "train.py") -> str:
        return f"Find out why the TPU step of `{entrypoint}` is slow and fix it.\n\n" + load_skill_body("tpu-tune")


def serve(workspace: str | None, transport: str = "stdio", port: int = 8765, log_level: str = "WARNING") -> None:
    """Run the server until the host disconnects; jobs still running are killed on the way out."""
    server = build_server(workspace, log_level=log_level)
    state: ServerState = server.state  # type: ignore[attr-defined]
    try:
        if transport == "stdio":
            server.run("stdio")
        else:
            server.run("streamable-http", host="127.0.0.1", port=port)
    finally:
        state.jobs.shutdown()


__all__ = ["MAX_WAIT_S", "SERVER_NAME", "ServerState", "build_server", "format_error", "serve"]
