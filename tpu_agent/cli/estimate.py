"""CLI command ``estimate``: compile a script's training step for a TPU target without a TPU (parsing and
rendering only; :func:`tpu_agent.estimate.script.estimate_script` does the work)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from tpu_agent.cli._options import chip_option
from tpu_agent.cli._output import (
    FORMAT_HELP,
    OutputFormat,
    console,
    console_err,
    handles_errors,
    print_json,
)
from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.estimate.options import (
    DEFAULT_EFFORT,
    DEFAULT_OPTIMIZER_STEPS,
    DEFAULT_TARGET,
    EFFORTS,
    MAX_OPTIMIZER_STEPS,
    MIN_OPTIMIZER_STEPS,
    STRATEGIES,
    efforts_help,
)
from tpu_agent.fsutil import atomic_write_text

ESTIMATE_HELP = """Compile a script's training step for a TPU slice with the TPU compiler (libtpu, deviceless
ahead-of-time), without a TPU: HBM per chip by kind against the chip's with a fits / does-not-fit verdict,
compiler FLOPs, bytes and step time, MFU, fusions and collectives; when it does not fit, the changes that
would (FSDP, bf16 state, a larger slice), each checked by compiling it.

The script runs for --steps optimizer steps on the emulated 'tpu' device (DeferAndFuse, XLA compiler), then
stops; the graphs of its last full step are compiled for --chip. Everything after SCRIPT belongs to the script.
Needs the compiler: pip install "tpu-agent[estimate]" (Linux x86_64).

--capture-only estimates models bigger than this machine (a 7B model on a laptop): the script runs with tensors
that hold shapes but no data, so nothing is computed and no parameter is allocated on the host. loss.item() and
print see zeros (one warning per line); code that branches on a tensor's value stops with an error naming the
line; nonzero / masked_select are bounded by their largest output. Without the flag, estimate switches to it by
itself when the model outgrows --host-memory (parameters x4, or the process's memory), and says so.

A step is cut at each optimizer.step(). If a graph of the step cannot be compiled, no verdict, time or MFU is
given from the rest unless --allow-partial (each figure then says which share of the step's ops it covers).

Exit codes: 0 fits, 1 does not fit or the script failed, 2 bad usage or no compiler, 4 internal error.

Examples:

  tpu-agent estimate --chip v5e-4 train.py

  tpu-agent estimate --chip v5e --format json train.py --batch-size 32

  tpu-agent estimate --chip v6e-8 --strategy fsdp --format markdown --output estimate.md train.py

  tpu-agent estimate --chip v5e-8 --strategy fsdp --capture-only train_7b.py
"""

ESTIMATE_FORMATS = (OutputFormat.text, OutputFormat.json, OutputFormat.markdown)


def _table(title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=bool(columns[0]))
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table


def _print_text(document: dict[str, Any]) -> None:
    from tpu_agent.estimate import report

    data = document["estimate"]
    console.print(_table(f"TPU estimate for {document['script']}", ("", ""), report.summary_rows(data)))
    console.print(_table("HBM per chip (largest program)", ("kind", "bytes"), report.memory_rows(data)))
    console.print(_table("Programs of one step", report.PROGRAM_COLUMNS, report.program_rows(data)))
    if data["suggestions"]:
        console.print(
            _table(
                "What would fit (compiled unless marked unverified)",
                report.SUGGESTION_COLUMNS,
                report.suggestion_rows(data),
            )
        )
    console.print("[bold]Assumptions[/]")
    for assumption in data["assumptions"]:
        console.print(f"  - {assumption}", highlight=False, soft_wrap=True)


def render(document: dict[str, Any], output_format: OutputFormat) -> str:
    import json

    from tpu_agent.estimate.report import to_markdown

    if output_format == OutputFormat.json:
        return json.dumps(document, indent=2) + "\n"
    return to_markdown(document["estimate"])


@handles_errors
def estimate(
    command: list[str] = typer.Argument(
        ..., metavar="SCRIPT [ARGS]...", help="Script path (or module with -m) and its arguments."
    ),
    module: bool = typer.Option(False, "-m", "--module", help="Treat SCRIPT as a module name, like python -m."),
    chip: str = chip_option(DEFAULT_TARGET, purpose="TPU target to compile for"),
    strategy: str | None = typer.Option(
        None,
        "--strategy",
        help=f"{' | '.join(STRATEGIES)} (default: data-parallel on a slice, else as-captured).",
    ),
    steps: int = typer.Option(
        DEFAULT_OPTIMIZER_STEPS,
        "--steps",
        help=f"Optimizer steps to run before capturing ({MIN_OPTIMIZER_STEPS} to {MAX_OPTIMIZER_STEPS}); the last is "
        "compiled.",
    ),
    suggest: bool = typer.Option(True, "--suggest/--no-suggest", help="When it does not fit, compile the fixes."),
    capture_only: bool = typer.Option(
        False,
        "--capture-only",
        help="Record the step from shapes without computing anything, for models bigger than this machine "
        "(tensors hold no data; loss.item() and print see zeros; a branch on a tensor value is an error).",
    ),
    allow_partial: bool = typer.Option(
        False,
        "--allow-partial",
        help="When some of the step's graphs cannot be compiled, still give figures for the rest, each marked with "
        "the share of the step's ops it covers (default: no verdict from part of a step).",
    ),
    host_memory: float | None = typer.Option(
        None,
        "--host-memory",
        help="GB of host memory the script may use when run for real; past it (judged from the parameters built so "
        "far, and the process's memory) estimate switches to --capture-only. Default: a quarter of this host's RAM.",
    ),
    effort: str = typer.Option(
        DEFAULT_EFFORT,
        "--effort",
        help=f"{' | '.join(EFFORTS)}. {efforts_help()}",
    ),
    output_format: OutputFormat = typer.Option(OutputFormat.text, "--format", help=FORMAT_HELP + " Also markdown."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to this file instead of stdout."),
    timeout: float | None = typer.Option(None, "--timeout", help="Stop the script after this many seconds."),
) -> None:
    from tpu_agent.estimate.script import EstimateOptions, estimate_script
    from tpu_agent.runtime.api import LaunchTarget

    if output_format not in ESTIMATE_FORMATS:
        raise TpuAgentError(
            "bad-format", f"estimates are text, json or markdown, not {output_format.value}", "use --format json"
        )
    if host_memory is not None and host_memory <= 0:
        raise TpuAgentError("bad-host-memory", f"--host-memory {host_memory}: must be a positive number of GB", "")
    options = EstimateOptions(
        target=chip,
        strategy=strategy,
        steps=steps,
        suggest=suggest,
        timeout_s=timeout,
        capture_only=capture_only,
        allow_partial=allow_partial,
        host_memory_bytes=int(host_memory * 1e9) if host_memory is not None else None,
        effort=effort,
    )
    target = LaunchTarget(command[0], list(command[1:]), is_module=module)
    from tpu_agent.cli.profile import _script_output_to_stderr

    with (
        _script_output_to_stderr(output is None and output_format != OutputFormat.text),
        console_err.status("estimating...") as status,
    ):
        result = estimate_script(target, options, progress=lambda message: status.update(message))
    if output is not None:
        text_format = OutputFormat.markdown if output_format == OutputFormat.text else output_format
        atomic_write_text(output, render(result.document, text_format))
        console_err.print(f"estimate written to {output}", highlight=False)
    elif output_format == OutputFormat.json:
        print_json(result.document)
    elif output_format == OutputFormat.markdown:
        typer.echo(render(result.document, output_format), nl=False)
    else:
        _print_text(result.document)
    if not result.fits:
        raise typer.Exit(int(ExitCode.FINDINGS))


def register(app: typer.Typer) -> None:
    """Add ``estimate`` to the root app."""
    app.command(
        "estimate",
        help=ESTIMATE_HELP,
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(estimate)
