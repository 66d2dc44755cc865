"""Reports of a migrate plan: text (rich) for people, JSON for agents, SARIF for code scanning, Markdown
for pull requests.

Every format is computed from one :class:`~tpu_agent.migrate.report.stats.Summary`, so the numbers agree
across formats; each renderer module only formats.
"""

from __future__ import annotations

from tpu_agent.errors import TpuAgentError
from tpu_agent.migrate.model import ApplyResult, Plan
from tpu_agent.migrate.report import json_report, markdown, sarif, text
from tpu_agent.migrate.report.diff import unified_diff
from tpu_agent.migrate.report.stats import Summary, summarize

FORMATS = ("text", "json", "sarif", "markdown")


def render(plan: Plan, fmt: str, applied: ApplyResult | None = None) -> str:
    """The report of ``plan`` in ``fmt`` (text | json | sarif | markdown); ``applied`` adds what was written."""
    summary = summarize(plan)
    if fmt == "text":
        return text.render(summary, applied)
    if fmt == "json":
        return json_report.render(summary, applied)
    if fmt == "sarif":
        return sarif.render(summary)
    if fmt == "markdown":
        return markdown.render(summary, applied)
    raise TpuAgentError(
        "unknown-report-format", f"unknown report format {fmt!r}", f"Choose one of: {', '.join(FORMATS)}."
    )


__all__ = ["FORMATS", "Summary", "render", "summarize", "unified_diff"]
