"""CLI command of ``tpu_agent.migrate``: ``tpu-agent migrate`` (``tpu-agent rules`` is in :mod:`tpu_agent.cli.rules`).

Argument parsing and rendering only: the plan, the writes and every safety check live in
:mod:`tpu_agent.migrate.api`, the numbers and formats in :mod:`tpu_agent.migrate.report`.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from tpu_agent.cli._output import console, console_err, handles_errors
from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.fsutil import atomic_write_text
from tpu_agent.migrate.model import MigrateOptions, Target, torch_version

# The API, report and rule modules are imported inside the commands: every `tpu-agent` invocation
# imports this module, and they pull in libcst and the whole rule catalogue.

# Below this many files a plan takes about a second; a bar would only flicker.
PROGRESS_MIN_FILES = 200


class ReportFormat(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    markdown = "markdown"


MIGRATE_HELP = """Rewrite CUDA-specific PyTorch code into device-agnostic / TorchTPU code.

By default the files are rewritten in place (refused when they have uncommitted git changes); [bold]--diff[/] and [bold]--check[/] write nothing, [bold]--output-dir[/] writes a migrated copy.

Exit codes: 0 done (or --check found nothing), 1 --check found changes or manual work, 2 bad arguments or paths, 3 refused (uncommitted changes, stale files, unsafe output dir).

Examples:

  tpu-agent migrate ./repo --diff

  tpu-agent migrate ./repo --check --format sarif --report migrate.sarif

  tpu-agent migrate train.py --target tpu --unsafe-fixes

  tpu-agent migrate ./repo --output-dir ./repo-tpu --select TPU1,TPU2 --ignore TPU105

  tpu-agent migrate ./repo --format json > plan.json

  tpu-agent migrate ./repo --min-torch 2.5 --diff
"""


def parse_codes(value: str | None) -> frozenset[str] | None:
    """``"TPU1,TPU201"`` -> the codes as given; :func:`tpu_agent.migrate.api.plan` upper-cases and checks them
    (:func:`tpu_agent.migrate.rules.rule_codes`), for this CLI and the MCP server alike."""
    if value is None:
        return None
    return frozenset(value.split(","))


@contextmanager
def progress_bar(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` callback drawing a rich bar on stderr, shown once a tree is large."""
    if not enabled:
        yield None
        return
    bar = Progress(
        TextColumn("[bold]migrate[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("files"),
        TimeRemainingColumn(),
        console=console_err,
        transient=True,
    )
    task: list[TaskID] = []

    def update(done: int, total: int) -> None:
        if not task:
            if total < PROGRESS_MIN_FILES:
                return
            bar.start()
            task.append(bar.add_task("plan", total=total))
        bar.update(task[0], completed=done, total=total)

    try:
        yield update
    finally:
        bar.stop()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Stop on SIGTERM the way Ctrl-C stops: a KeyboardInterrupt unwinds the run, so a file being written is
    either replaced whole or left as it was, its temporary file is removed, and worker processes are shut
    down (the default SIGTERM action would kill the process mid-write and leave a temporary file behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_combination(
    diff: bool, check: bool, output_dir: Path | None, output_format: ReportFormat, report: Path | None
) -> None:
    if output_dir is not None and (diff or check):
        flag = "--diff" if diff else "--check"
        raise TpuAgentError(
            "conflicting-options",
            f"--output-dir writes files but {flag} writes nothing",
            f"Drop {flag} or --output-dir.",
        )
    if diff and output_format != ReportFormat.text and report is None:
        raise TpuAgentError(
            "conflicting-options",
            f"--diff prints a unified diff on stdout, so --format {output_format.value} has nowhere to go",
            f"Add --report FILE to write the {output_format.value} report to a file as well.",
        )


def _check_min_torch(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        torch_version(value)
    except ValueError as exc:
        raise TpuAgentError(
            "bad-option",
            f"--min-torch: {exc}",
            hint="give a torch release such as --min-torch 2.5",
            exit_code=ExitCode.USAGE,
        ) from None
    return value


def migrate(
    paths: list[Path] = typer.Argument(
        ..., help="Files or directories to migrate (.py, .ipynb, shell, env, YAML, Dockerfile).", show_default=False
    ),
    diff: bool = typer.Option(False, "--diff", help="Print a unified diff of the rewrite and write nothing."),
    check: bool = typer.Option(
        False,
        "--check",
        help="Write nothing; exit 1 when anything would change or needs manual work (for CI and pre-commit).",
    ),
    output_dir: Path | None = typer.Option(
        None,
        "--output-dir",
        "-o",
        help="Write a migrated copy of the tree into DIR; the source is left untouched.",
        metavar="DIR",
    ),
    select: str | None = typer.Option(
        None, "--select", help="Only these rule codes or prefixes, comma-separated (e.g. TPU1,TPU201).", metavar="CODES"
    ),
    ignore: str | None = typer.Option(
        None, "--ignore", help="Skip these rule codes or prefixes, comma-separated.", metavar="CODES"
    ),
    unsafe_fixes: bool = typer.Option(
        False, "--unsafe-fixes", help="Also apply fixes that rest on an assumption the report names."
    ),
    target: Target = typer.Option(
        Target.ACCELERATOR,
        "--target",
        help="accelerator: device-agnostic torch.accelerator code; tpu: literal TorchTPU forms.",
        case_sensitive=False,
    ),
    annotate: bool = typer.Option(
        False, "--annotate", help="Insert '# TODO(tpu-agent CODE): ...' comments at items needing manual work."
    ),
    min_torch: str | None = typer.Option(
        None,
        "--min-torch",
        help="Oldest torch the output must run on (e.g. 2.5): rewrites to newer APIs are reported, not applied.",
        metavar="VERSION",
    ),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Worker processes for parsing; 0 means one per core."),
    file_budget: float = typer.Option(
        60.0,
        "--file-budget",
        min=0.1,
        help="Seconds a deeply nested or otherwise risky file may take (in its own process) before it is skipped; "
        "ordinary files are not limited.",
        metavar="SECONDS",
    ),
    allow_dirty: bool = typer.Option(
        False, "--allow-dirty", help="Rewrite files even when they have uncommitted git changes."
    ),
    output_format: ReportFormat = typer.Option(
        ReportFormat.text,
        "--format",
        "-f",
        help="Report format: text for people, json for agents, sarif for code scanning, markdown for PRs.",
    ),
    report: Path | None = typer.Option(
        None, "--report", help="Write the report (in --format) to FILE and print only a short summary.", metavar="FILE"
    ),
) -> None:
    from tpu_agent.migrate import api
    from tpu_agent.migrate.report import render, summarize, unified_diff
    from tpu_agent.migrate.report import text as text_report

    _check_combination(diff, check, output_dir, output_format, report)
    options = MigrateOptions(
        select=parse_codes(select),
        ignore=parse_codes(ignore) or frozenset(),
        unsafe_fixes=unsafe_fixes,
        target=target,
        annotate=annotate,
        jobs=jobs,
        min_torch=_check_min_torch(min_torch),
        file_budget_s=file_budget,
    )
    show_progress = output_format == ReportFormat.text and console_err.is_terminal
    with sigterm_as_interrupt():
        with progress_bar(show_progress) as progress:
            plan = api.plan(paths, options, progress)
        applied = None if (diff or check) else api.apply(plan, output_dir=output_dir, allow_dirty=allow_dirty)
    summary = summarize(plan)
    if diff:
        sys.stdout.write(unified_diff(plan))
        sys.stdout.flush()
    if report is not None or diff:
        short = console_err if diff else console
        if report is not None:
            atomic_write_text(report, render(plan, output_format.value, applied))
        for line in text_report.skipped_lines(summary):
            short.print(line, highlight=False, soft_wrap=True)
        short.print(text_report.totals_line(summary.totals), highlight=False, soft_wrap=True)
        if applied is not None:
            short.print(text_report.applied_line(applied), highlight=False, soft_wrap=True)
        if report is not None:
            short.print(f"{output_format.value} report written to {report}", highlight=False, soft_wrap=True)
    elif output_format == ReportFormat.text:
        text_report.print_report(summary, console, applied)
    else:
        sys.stdout.write(render(plan, output_format.value, applied))
        sys.stdout.flush()
    if check and summary.needs_attention:
        raise typer.Exit(int(ExitCode.FINDINGS))


def register(app: typer.Typer) -> None:
    """Add this group's commands to the root app."""
    app.command("migrate", help=MIGRATE_HELP, no_args_is_help=True)(handles_errors(migrate))
