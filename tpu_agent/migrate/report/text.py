"""The human report: one ``path:line:col: CODE [safety] message`` line per finding, then tables.

The finding lines follow the format compilers and ruff/TorchFix use, so editors and terminals turn them
into links. The same rich renderables serve the colour terminal (:func:`print_report`) and the plain
string :func:`render` returns for files and tests.
"""

from __future__ import annotations

import io

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from tpu_agent.migrate.model import ApplyResult, Finding, Safety
from tpu_agent.migrate.report.stats import Summary, Totals

_SAFETY_STYLE = {Safety.SAFE: "green", Safety.UNSAFE: "yellow", Safety.MANUAL: "red"}


def finding_line(finding: Finding) -> Text:
    """``path:line:col: CODE [safety] message``; fixed sites are dimmed, unapplied unsafe fixes say how."""
    line = Text()
    line.append(f"{finding.path}:{finding.line}:{finding.column}:", style="bold")
    line.append(f" {finding.code} ", style="cyan")
    line.append(f"[{finding.safety.value}]", style=_SAFETY_STYLE[finding.safety])
    line.append(f" {finding.message}", style="dim" if finding.fixed else "")
    if finding.fixed:
        line.append(" (fixed)", style="green")
    elif finding.safety == Safety.UNSAFE:
        line.append(" (fix available with --unsafe-fixes)", style="yellow")
    return line


def percent_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def totals_line(totals: Totals) -> str:
    """The one-paragraph summary, also printed alone when the full report goes to a file."""
    return (
        f"{totals.files_examined} files examined ({totals.files_parsed} parsed, {totals.files_prefiltered} "
        f"prefiltered, {totals.files_skipped} skipped), {totals.files_changed} changed. "
        f"CUDA-specific references: {totals.references}, converted {totals.converted} "
        f"({percent_text(totals.conversion_percent)}), left for a person {totals.unconverted} "
        f"({totals.unconverted_unsafe} unsafe fixes not applied, {totals.unconverted_manual} manual)."
    )


def applied_line(applied: ApplyResult) -> str:
    if applied.output_dir is not None:
        migrated = len(applied.written) - len(applied.copied)
        line = (
            f"Wrote {len(applied.written)} file(s) into {applied.output_dir}: {migrated} migrated, "
            f"{len(applied.copied)} copied unchanged; {len(applied.unchanged)} already up to date there."
        )
    else:
        line = f"Wrote {len(applied.written)} file(s); {len(applied.unchanged)} left as they were."
    if applied.removed_temp_files:
        names = ", ".join(str(p) for p in applied.removed_temp_files[:5])
        more = f" and {len(applied.removed_temp_files) - 5} more" if len(applied.removed_temp_files) > 5 else ""
        line += f" Removed {len(applied.removed_temp_files)} temporary file(s) an interrupted run left: {names}{more}."
    if applied.not_copied:
        line += f" Not copied: {'; '.join(applied.not_copied)}."
    return line


def skipped_lines(summary: Summary) -> list[Text]:
    """``Skipped files:`` and one line per skipped file with its reason (which names the file and line), printed
    in every mode, ``--diff`` and ``--report`` included: a file left out of a migration must never go unseen."""
    if not summary.skipped:
        return []
    lines = [Text("Skipped files:", style="bold")]
    for f in summary.skipped:
        reason = f.result.skipped_reason or ""
        path = f.result.display_path
        lines.append(Text(f"  {reason}" if reason.startswith(path) else f"  {path}: {reason}"))
    return lines


def renderables(summary: Summary, applied: ApplyResult | None = None) -> list[RenderableType]:
    """Everything the text report shows, in order."""
    parts: list[RenderableType] = [finding_line(f) for f in summary.findings]
    if summary.rules:
        table = Table(title="Sites by rule", title_justify="left")
        for column in ("Code", "Name", "Safety", "Found", "Fixed"):
            table.add_column(column, justify="right" if column in ("Found", "Fixed") else "left")
        for rule in summary.rules:
            table.add_row(rule.code, rule.name, rule.safety.value, str(rule.found), str(rule.fixed))
        parts += [Text(), table]
    files = [f for f in summary.reported_files if f.status != "skipped"]
    if files:
        table = Table(title="Files with CUDA-specific references", title_justify="left")
        for column in ("File", "References", "Converted", "%", "Status"):
            table.add_column(column, justify="left" if column in ("File", "Status") else "right")
        for f in files:
            table.add_row(
                f.result.display_path, str(f.references), str(f.converted), percent_text(f.conversion_percent), f.status
            )
        parts += [Text(), table]
    if summary.skipped:
        parts += [Text(), *skipped_lines(summary)]
    parts += [Text(), Text(totals_line(summary.totals), style="bold")]
    if applied is not None:
        parts.append(Text(applied_line(applied)))
    return parts


def print_report(summary: Summary, console: Console, applied: ApplyResult | None = None) -> None:
    """Print the report with colour on ``console`` (finding lines never wrap, so they stay clickable)."""
    for part in renderables(summary, applied):
        console.print(part, soft_wrap=isinstance(part, Text), highlight=False)


def render(summary: Summary, applied: ApplyResult | None = None) -> str:
    """The report as plain text (no colour codes), for ``--report FILE`` and for tests."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, color_system=None, force_terminal=False, highlight=False)
    print_report(summary, console, applied)
    return buffer.getvalue()


__all__ = [
    "applied_line",
    "finding_line",
    "percent_text",
    "print_report",
    "render",
    "renderables",
    "skipped_lines",
    "totals_line",
]
