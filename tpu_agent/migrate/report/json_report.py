"""The JSON report: a versioned, documented schema that agents and scripts can rely on.

``schema_version`` changes only when a field is removed or changes meaning; new fields may be added
within a version. The schema ships as ``schema/migrate-report.v1.schema.json`` (tests validate every
report against it) and is described for people in ``docs/migrate-json-schema.md``.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from tpu_agent import __version__
from tpu_agent.migrate.model import ApplyResult
from tpu_agent.migrate.report.stats import FileStats, Summary

SCHEMA_VERSION = 1
SCHEMA_RESOURCE = "migrate-report.v1.schema.json"


def load_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) every ``--format json`` migrate report conforms to."""
    text = (
        resources.files("tpu_agent.migrate.report")
        .joinpath("schema")
        .joinpath(SCHEMA_RESOURCE)
        .read_text(encoding="utf-8")
    )
    return json.loads(text)


def _file(stats: FileStats) -> dict[str, Any]:
    result = stats.result
    return {
        "path": result.display_path,
        "kind": result.kind.value,
        "status": stats.status,
        "lines": result.lines,
        "references": stats.references,
        "converted": stats.converted,
        "conversion_percent": stats.conversion_percent,
        "by_rule": {code: {"found": found, "fixed": fixed} for code, (found, fixed) in stats.by_rule.items()},
        "skipped_reason": result.skipped_reason,
    }


def _applied(applied: ApplyResult) -> dict[str, Any]:
    return {
        "mode": "output-dir" if applied.output_dir is not None else "in-place",
        "output_dir": str(applied.output_dir) if applied.output_dir is not None else None,
        "written": [str(p) for p in applied.written],
        "unchanged": len(applied.unchanged),
        "copied_unchanged": len(applied.copied),
        "removed_temp_files": [str(p) for p in applied.removed_temp_files],
        "not_copied": list(applied.not_copied),
    }


def to_dict(summary: Summary, applied: ApplyResult | None = None) -> dict[str, Any]:
    """The report as plain data (the object ``render`` serialises)."""
    totals = summary.totals
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "tpu-agent", "version": __version__},
        "roots": [str(root) for root in summary.plan.roots],
        "options": summary.plan.options.to_dict(),
        "summary": {
            "files_examined": totals.files_examined,
            "files_parsed": totals.files_parsed,
            "files_prefiltered": totals.files_prefiltered,
            "files_skipped": totals.files_skipped,
            "files_changed": totals.files_changed,
            "lines_examined": totals.lines_examined,
            "lines_parsed": totals.lines_parsed,
            "lines_prefiltered": totals.lines_prefiltered,
            "references": totals.references,
            "converted": totals.converted,
            "unconverted": totals.unconverted,
            "unconverted_unsafe": totals.unconverted_unsafe,
            "unconverted_manual": totals.unconverted_manual,
            "conversion_percent": totals.conversion_percent,
            "needs_attention": summary.needs_attention,
        },
        "rules": [
            {"code": r.code, "name": r.name, "safety": r.safety.value, "found": r.found, "fixed": r.fixed}
            for r in summary.rules
        ],
        # Prefiltered files carry no findings; the summary counts them instead of listing thousands.
        "files": [_file(f) for f in summary.files if f.status != "prefiltered"],
        "findings": [f.to_dict() for f in summary.findings],
        "applied": _applied(applied) if applied is not None else None,
    }


def render(summary: Summary, applied: ApplyResult | None = None) -> str:
    return json.dumps(to_dict(summary, applied), indent=2) + "\n"
