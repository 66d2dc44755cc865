"""The check tool: validate a model on the ``tpu`` device as a job, via ``tpu-agent check``.

A check runs forward + backward on CPU and on ``tpu`` in up to three modes, each in its own process: tens of
seconds for a tiny model, minutes for a real one, longer than hosts let a tool call last. So ``tpu_check``
starts ``tpu-agent check MODEL --output .tpu-agent/checks/<job_id>/check.json`` as a job (polled with
``tpu_job_status``, stopped with ``tpu_job_cancel``) under the server's job limits.

MODEL is untrusted text from an agent, and a factory is code that the check runs, so each form is held to the
workspace before anything starts:

* a Hugging Face model type: a plain name that transformers knows (built from a tiny config, no download);
* a model directory: resolved (symlinks included) inside the workspace; its own code is never run;
* ``path/file.py:function``: the file resolved inside the workspace;
* ``package.module:function``: only when the module is a file in the workspace and its top-level name
  cannot be imported from anywhere else (so ``os:abort`` or an installed package never runs).
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from tpu_agent.check.model import MODES
from tpu_agent.check.spec import WEIGHT_FILES, WEIGHT_INDEXES, parse_model_spec
from tpu_agent.check.tiny import TASK_MAPPINGS
from tpu_agent.errors import ExitCode, TpuAgentError, clipped
from tpu_agent.plugins import models
from tpu_agent.plugins.jobs import Job, JobState, new_job_id
from tpu_agent.plugins.limits import MAX_PATH_CHARS
from tpu_agent.plugins.tools.args import BackendArg, ChipArg, CompilerArg, TimeoutArg, WaitArg, WorkspaceArg
from tpu_agent.plugins.tools.common import ToolSpec, in_thread, server_state, tool_hints
from tpu_agent.plugins.tools.jobs import CHECK_FILE, job_result, report_file, wait_for_job
from tpu_agent.plugins.workspace import Workspace

_MODEL_TYPE_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_DOTTED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MODEL_HINT = (
    "Pass a Hugging Face model type (e.g. 'llama', 'bert', 't5'), a model directory in the workspace (e.g. "
    "'models/my-finetune'), or a factory in the workspace: 'path/to/file.py:make_model' or "
    "'mypkg.models:make_model', a function taking no arguments and returning (model, example_inputs)."
)

ModelArg = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_PATH_CHARS,
        description="Hugging Face model type ('llama'), workspace model directory ('models/ft'), or a workspace "
        "factory 'path/file.py:function' / 'package.module:function' returning (model, example_inputs).",
    ),
]
if TYPE_CHECKING:  # mypy cannot read a Literal built from a table; pydantic (the tool schema) can
    TaskArg = str | None
    ModesArg = list[str] | None
else:
    TaskArg = Annotated[
        Literal[tuple(TASK_MAPPINGS)] | None,
        Field(description="Hugging Face task head (default: the first the model type has); not for factories."),
    ]
    ModesArg = Annotated[
        list[Literal[tuple(MODES)]] | None,
        Field(min_length=1, max_length=len(MODES), description="Modes to check (default: all three)."),
    ]


def _refused(model: str, why: str) -> TpuAgentError:
    return TpuAgentError("bad-model", f"model {clipped(model)} {why}", MODEL_HINT, ExitCode.USAGE)


def _importable_outside(top_level: str, ws: Workspace) -> bool:
    """Whether ``top_level`` names a module Python finds without the workspace (built in, stdlib, installed)."""
    if top_level in sys.builtin_module_names:
        return True
    elsewhere = [entry for entry in sys.path if entry and not Path(os.path.realpath(entry)).is_relative_to(ws.root)]
    return importlib.machinery.PathFinder.find_spec(top_level, elsewhere) is not None


def _factory_target(ws: Workspace, model: str) -> str:
    module, _, function = model.rpartition(":")
    if module.endswith(".py"):
        path = ws.resolve(module)
        if not path.is_file():
            raise _refused(model, "names a factory file that is not a file")
        return f"{path}:{function}"
    if not _DOTTED_RE.match(module):
        raise _refused(model, "is neither a .py file nor a dotted module name before the ':'")
    parts = module.split(".")
    base = ws.root.joinpath(*parts)
    candidates = [base.with_suffix(".py"), base / "__init__.py"]
    if not any(ws.resolve(candidate, must_exist=False).is_file() for candidate in candidates):
        raise _refused(model, f"names module {module!r}, which is not a file in the workspace {ws.root}")
    if _importable_outside(parts[0], ws):
        raise _refused(
            model,
            f"names module {module!r}, but {parts[0]!r} is also importable from outside the workspace, so the "
            "check might run that instead",
        )
    return model


def resolve_model(ws: Workspace, model: str) -> str:
    """MODEL as the job passes it to ``tpu-agent check``: checked against the workspace, paths made absolute."""
    model = model.strip()
    if "\x00" in model or not model:
        raise _refused(model, "is empty or contains a NUL byte")
    if ":" in model:
        return _factory_target(ws, model)
    if "/" in model or "\\" in model or model.startswith(".") or (ws.root / model).is_dir():
        directory = ws.resolve(model)
        if not directory.is_dir():
            raise _refused(model, "names a path that is not a directory")
        for name in ("config.json", *WEIGHT_INDEXES, *WEIGHT_FILES):  # a link in the directory may not lead out
            ws.resolve(directory / name, must_exist=False)
        return str(directory)
    if not _MODEL_TYPE_RE.match(model) or len(model) > 64:
        raise _refused(model, "is not a model type name (lower-case letters, digits, '_' and '-')")
    return model


def _judge_check(job: Job) -> JobState | None:
    """``tpu-agent check`` exits 1 on a mismatch or error: with the report written, that is an answer."""
    if job.exit_code == ExitCode.FINDINGS and report_file(job, "check", CHECK_FILE) is not None:
        return JobState.SUCCEEDED
    return None


async def tpu_check(
    ctx: Context,
    model: ModelArg,
    task: TaskArg = None,
    modes: ModesArg = None,
    backend: BackendArg = "auto",
    chip: ChipArg = None,
    compiler: CompilerArg = None,
    localise: Annotated[bool, Field(description="On a divergence, find the first diverging submodule and op.")] = True,
    timeout_s: TimeoutArg = 1800,
    wait_s: WaitArg = 20,
    workspace: WorkspaceArg = None,
) -> models.JobResult:
    state = server_state(ctx)
    ws = await state.workspace(ctx, workspace)
    target = resolve_model(ws, model)
    # the same validation as the CLI (known model type, task, config.json, weight index), before a job starts
    await in_thread(lambda: parse_model_spec(target, task))
    job_id = new_job_id("check")
    artefacts = ws.artefact_dir("checks", job_id, fresh=True)
    argv = [sys.executable, "-m", "tpu_agent", "check", "--backend", backend, "--timeout", str(timeout_s)]
    argv += ["--output", ws.relative(artefacts / CHECK_FILE)]
    for mode in dict.fromkeys(modes or ()):
        argv += ["--mode", mode]
    if task:
        argv += ["--task", task]
    if chip:
        argv += ["--chip", chip]
    if compiler:
        argv += ["--compiler", compiler]
    if not localise:
        argv.append("--no-localise")
    argv += ["--", target]
    try:
        job = state.jobs.start(
            "check", argv, ws, timeout_s=timeout_s, artefact_dir=artefacts, job_id=job_id, judge=_judge_check
        )
    except TpuAgentError:
        artefacts.rmdir()  # refused (busy): leave no empty check directory behind
        raise
    await wait_for_job(ctx, job, wait_s)
    return job_result(job)


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        tpu_check,
        "tpu_check",
        "Validate a model on the TPU device as a job, via `tpu-agent check`: forward + backward on CPU and on "
        "tpu in Strict, DeferAndFuse and torch.compile(backend='tpu'), outputs and gradients compared at "
        "matmul precision 'highest'. model is a Hugging Face model type (tiny config, random weights, no "
        "download), a workspace model directory, or a workspace factory returning (model, example_inputs). "
        "When the job is final, read check_path: per mode pass / mismatch / error and, for a failure, the "
        "first diverging submodule and op. Exit code 1 means a mode failed. Poll with tpu_job_status.",
        tool_hints("Check a model on TPU", read_only=False, idempotent=False),
    ),
)

__all__ = ["TOOLS", "resolve_model", "tpu_check"]
