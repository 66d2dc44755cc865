"""CLI commands of ``tpu_agent.profile``: ``profile`` and ``diagnose`` (argument parsing and rendering only)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tpu_agent.cli._options import Compiler, EagerModeChoice, chip_option, compiler_env, compiler_option
from tpu_agent.cli._output import FORMAT_HELP, OutputFormat, console, console_err, handles_errors, print_json
from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.fsutil import atomic_write_text
from tpu_agent.profile.options import (
    DEFAULT_LOGDIR,
    DEFAULT_STEPS,
    DEFAULT_WARMUP,
    MAX_STEPS,
    MAX_WARMUP,
    VERIFY_CAPTURE_LIMIT_S,
    VERIFY_MAX_STEPS,
    VERIFY_TIMEOUT_S,
    verify_default,
)

if TYPE_CHECKING:  # the model (and the runtime's event types) load only when a profile command runs
    from tpu_agent.profile.model import Diagnosis

REPORT_FORMATS = (OutputFormat.text, OutputFormat.json, OutputFormat.markdown, OutputFormat.html)

PROFILE_HELP = """Run a script on the TorchTPU 'tpu' device with profiling on, write an XProf session
(TensorBoard's Profile tab or `xprof --logdir`), and diagnose it: findings with the file and line to change,
a concrete edit, and the estimated saving; plus a roofline estimate of the step on the chosen TPU.

Everything after SCRIPT belongs to the script. Reports also land in LOGDIR/tpu-agent/ (json, md, html).
Exit code 1 when an error-level finding was made or the script failed.

Examples:

  tpu-agent profile train.py --epochs 1

  tpu-agent profile --steps 20 --warmup 5 --chip v5e train.py

  tpu-agent profile --eager-mode defer-and-fuse --format json train.py

  tpu-agent profile --eager-mode defer-and-fuse --compiler xla train.py

  tpu-agent profile --format html --output report.html train.py
"""

DIAGNOSE_HELP = """Re-analyse an existing capture: a LOGDIR from `tpu-agent profile`, or an XProf log directory,
session directory or .xplane.pb written by TorchTPU or JAX (annotated into a copy, SESSION_tpu-agent).

Examples:

  tpu-agent diagnose tpu-agent-profile

  tpu-agent diagnose /tmp/jax-trace --chip v5e --format markdown

  tpu-agent diagnose ./logs --format json
"""


@contextlib.contextmanager
def _script_output_to_stderr(enabled: bool) -> Iterator[None]:
    """Keep stdout machine-readable: the profiled script's prints go to stderr while it runs."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _emit(diagnosis: Diagnosis, output_format: OutputFormat, output: Path | None) -> None:
    from tpu_agent.profile.report import render
    from tpu_agent.profile.report.text import renderables

    if output_format not in REPORT_FORMATS:
        raise TpuAgentError(
            "bad-format",
            f"profile reports are text, json, markdown or html, not {output_format.value}",
            "use --format json",
        )
    if output is not None:
        atomic_write_text(output, render(diagnosis, output_format.value))
        console_err.print(f"report written to {output}", highlight=False)
    elif output_format == OutputFormat.json:
        print_json(diagnosis.to_dict())
    elif output_format == OutputFormat.text:
        for part in renderables(diagnosis.to_dict()):
            console.print(part)
    else:
        typer.echo(render(diagnosis, output_format.value), nl=False)


@handles_errors
def profile(
    command: list[str] = typer.Argument(
        ..., metavar="SCRIPT [ARGS]...", help="Script path (or module with -m) and its arguments."
    ),
    module: bool = typer.Option(False, "-m", "--module", help="Treat SCRIPT as a module name, like python -m."),
    steps: int = typer.Option(
        DEFAULT_STEPS, "--steps", min=1, max=MAX_STEPS, help="Steps to measure (after the warm-up)."
    ),
    warmup: int = typer.Option(
        DEFAULT_WARMUP, "--warmup", min=0, max=MAX_WARMUP, help="Steps to run before measuring (compiles, cache fills)."
    ),
    logdir: Path = typer.Option(DEFAULT_LOGDIR, "--logdir", help="Where the XProf session and reports go."),
    chip: str = chip_option(purpose="TPU to emulate and estimate for"),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Ranks on this host."),
    eager_mode: EagerModeChoice | None = typer.Option(None, "--eager-mode", help="strict | debug | defer-and-fuse."),
    compiler: Compiler | None = compiler_option(),
    output_format: OutputFormat = typer.Option(
        OutputFormat.text, "--format", help=FORMAT_HELP + " Also markdown, html."
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to this file instead of stdout."),
    timeout: float | None = typer.Option(None, "--timeout", help="Stop the script after this many seconds."),
    tpu_compiler: bool = typer.Option(
        False,
        "--tpu-compiler/--no-tpu-compiler",
        help="Also compile the step with libtpu (as tpu-agent estimate does) and report the TPU compiler's "
        "memory and cost beside the roofline; runs the script a second time.",
    ),
    verify: bool | None = typer.Option(
        None,
        "--verify/--no-verify",
        help="Before offering a finding's diff, apply it to a copy of the script's folder, run that for a few steps "
        "and check the losses match and the finding is gone (one short run per diff). --no-verify keeps the diffs, "
        "marked not checked. Default: verify, unless TPU_AGENT_PROFILE_VERIFY=0.",
    ),
    verify_steps: int = typer.Option(
        VERIFY_MAX_STEPS, "--verify-steps", min=1, max=MAX_STEPS, help="Measured steps of each patched run at most."
    ),
    verify_timeout: float = typer.Option(
        VERIFY_TIMEOUT_S, "--verify-timeout", min=1, help="Seconds a patched run may take before its diff is withheld."
    ),
    verify_capture_limit: float = typer.Option(
        VERIFY_CAPTURE_LIMIT_S,
        "--verify-capture-limit",
        min=0,
        help="Skip verification (saying so) when the capture itself took longer than this many seconds.",
    ),
    stop_after_window: bool = typer.Option(
        False, "--stop-after-window", hidden=True, help="End the script when the measured window ends."
    ),
) -> None:
    from tpu_agent.profile.api import profile as run_profile
    from tpu_agent.profile.options import ProfileOptions
    from tpu_agent.runtime.api import LaunchTarget

    options = ProfileOptions(
        steps=steps,
        warmup=warmup,
        logdir=logdir,
        chip=chip,
        nproc=nproc,
        eager_mode=eager_mode.value if eager_mode is not None else None,
        env=compiler_env(compiler),
        timeout_s=timeout,
        tpu_compiler=tpu_compiler,
        verify=verify_default() if verify is None else verify,
        verify_steps=verify_steps,
        verify_timeout_s=verify_timeout,
        verify_capture_limit_s=verify_capture_limit,
        stop_after_window=stop_after_window,
    )
    target = LaunchTarget(command[0], list(command[1:]), is_module=module)
    with (
        _script_output_to_stderr(output is None and output_format != OutputFormat.text),
        console_err.status("profiling...") as status,
    ):
        result = run_profile(target, options, progress=lambda message: status.update(message))
    _emit(result.report, output_format, output)
    if result.exit_code != 0:
        console_err.print(
            f"[yellow]note[/]: {command[0]} exited with code {result.exit_code}; the report covers what ran."
        )
    if result.exit_code != 0 or result.report.has_errors:
        raise typer.Exit(int(ExitCode.FINDINGS))


@handles_errors
def diagnose(
    logdir: Path = typer.Argument(
        ..., help="A tpu-agent profile logdir, an XProf logdir/session, or an .xplane.pb file."
    ),
    chip: str | None = chip_option(None, purpose="Estimate for this TPU instead of the captured one"),
    output_format: OutputFormat = typer.Option(
        OutputFormat.text, "--format", help=FORMAT_HELP + " Also markdown, html."
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to this file instead of stdout."),
) -> None:
    from tpu_agent.profile.api import diagnose as run_diagnose

    with console_err.status("analysing..."):
        diagnosis = run_diagnose(logdir, chip=chip)
    _emit(diagnosis, output_format, output)
    if diagnosis.has_errors:
        raise typer.Exit(int(ExitCode.FINDINGS))


def register(app: typer.Typer) -> None:
    """Add ``profile`` and ``diagnose`` to the root app."""
    app.command(
        "profile",
        help=PROFILE_HELP,
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(profile)
    app.command("diagnose", help=DIAGNOSE_HELP)(diagnose)
