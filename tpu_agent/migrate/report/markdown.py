"""The Markdown report: a pull-request description for the migration commit.

Reviewers see the headline numbers first, then a checklist of what a person still has to port (each
item a ``path:line:col`` they can search for), then the rewrites per rule and per file folded away.
"""

from __future__ import annotations

from tpu_agent.migrate.model import ApplyResult
from tpu_agent.migrate.report.stats import Summary
from tpu_agent.migrate.report.text import applied_line, percent_text


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, no line breaks)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """Inline code that survives backticks in the text."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def render(summary: Summary, applied: ApplyResult | None = None) -> str:
    t = summary.totals
    lines = [
        "## Migrate CUDA-specific PyTorch code to TorchTPU (`tpu-agent migrate`)",
        "",
        f"- **{t.files_changed}** file(s) {'rewritten' if applied is not None else 'to rewrite'}, {t.files_examined} examined "
        f"({t.files_parsed} parsed, {t.files_prefiltered} prefiltered, {t.files_skipped} skipped)",
        f"- **{t.converted} of {t.references}** CUDA-specific references converted "
        f"(**{percent_text(t.conversion_percent)}**)",
        f"- **{t.unconverted}** left for a person: {t.unconverted_manual} manual, "
        f"{t.unconverted_unsafe} unsafe fixes not applied",
    ]
    options = summary.plan.options
    lines.append(
        f"- Target: `{options.target.value}`; unsafe fixes {'applied' if options.unsafe_fixes else 'not applied'}"
    )
    if applied is not None:
        lines.append(f"- {applied_line(applied)}")
    if summary.manual:
        lines += ["", "### Needs manual work", ""]
        lines += [
            f"- [ ] {_code(f'{f.path}:{f.line}:{f.column}')} **{f.code}** [{f.safety.value}] {cell(f.message)}"
            for f in summary.manual
        ]
    if summary.rules:
        lines += ["", "### Sites by rule", "", "| Rule | Name | Safety | Found | Fixed |", "|---|---|---|---:|---:|"]
        lines += [f"| {r.code} | {cell(r.name)} | {r.safety.value} | {r.found} | {r.fixed} |" for r in summary.rules]
    files = [f for f in summary.reported_files if f.status != "skipped"]
    if files:
        lines += [
            "",
            "<details><summary>Per-file statistics</summary>",
            "",
            "| File | References | Converted | % | Status |",
            "|---|---:|---:|---:|---|",
        ]
        lines += [
            f"| {cell(f.result.display_path)} | {f.references} | {f.converted} | {percent_text(f.conversion_percent)} | {f.status} |"
            for f in files
        ]
        lines += ["", "</details>"]
    if summary.skipped:
        lines += ["", "### Skipped files", ""]
        lines += [f"- {_code(f.result.display_path)}: {cell(f.result.skipped_reason or '')}" for f in summary.skipped]
    return "\n".join(lines) + "\n"
