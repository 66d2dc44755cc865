"""SARIF 2.1.0 for GitHub code scanning and other CI annotators.

Each matched rule becomes a ``reportingDescriptor`` (its summary, rationale and before/after example as
help text); each finding a ``result`` at its region. Sites the plan rewrites are ``note``; sites left for
a person (manual items and unsafe fixes not applied) are ``warning``, so code scanning surfaces the work
that remains. Files the engine had to skip become tool execution notifications. Relative paths are
resolved against ``%SRCROOT%`` (the working directory), which is how GitHub maps them onto the repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tpu_agent import __version__
from tpu_agent.migrate.model import Finding
from tpu_agent.migrate.report.stats import RuleStats, Summary

SARIF_SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
INFORMATION_URI = "https://github.com/tpu-agent/tpu-agent"


def _artifact(path: str) -> dict[str, str]:
    """A SARIF artifactLocation: relative paths against %SRCROOT%, absolute ones as file URIs."""
    if os.path.isabs(path):
        return {"uri": Path(path).as_uri()}
    return {"uri": quote(Path(path).as_posix()), "uriBaseId": "%SRCROOT%"}


def _descriptor(rule: RuleStats) -> dict[str, Any]:
    descriptor: dict[str, Any] = {
        "id": rule.code,
        "name": rule.name,
        "defaultConfiguration": {"level": "note" if rule.safety.value == "safe" else "warning"},
        "properties": {"safety": rule.safety.value},
    }
    if rule.rule is not None:
        info = rule.rule
        help_text = f"{info.rationale}\n\nBefore:\n{info.before}\n\nAfter:\n{info.after}\n\nReference: {info.reference}"
        help_markdown = (
            f"{info.rationale}\n\n**Before**\n\n```\n{info.before}\n```\n\n"
            f"**After**\n\n```\n{info.after}\n```\n\nReference: {info.reference}"
        )
        descriptor["shortDescription"] = {"text": info.summary}
        descriptor["fullDescription"] = {"text": info.rationale}
        descriptor["help"] = {"text": help_text, "markdown": help_markdown}
        descriptor["properties"]["tags"] = [info.family, info.safety.value]
        url = next((ref for ref in info.references if ref.startswith("https://")), None)
        if url is not None:
            descriptor["helpUri"] = url
    return descriptor


def _region(finding: Finding) -> dict[str, int]:
    region = {"startLine": finding.line, "startColumn": finding.column}
    if finding.end_line is not None:
        region["endLine"] = finding.end_line
    if finding.end_column is not None:
        region["endColumn"] = finding.end_column
    return region


def _result(finding: Finding, rule_index: int) -> dict[str, Any]:
    status = "rewritten by tpu-agent migrate" if finding.fixed else f"needs a person ({finding.safety.value})"
    return {
        "ruleId": finding.code,
        "ruleIndex": rule_index,
        "level": "note" if finding.fixed else "warning",
        "message": {"text": f"{finding.message} [{status}]"},
        "locations": [{"physicalLocation": {"artifactLocation": _artifact(finding.path), "region": _region(finding)}}],
        "properties": {"safety": finding.safety.value, "fixed": finding.fixed},
    }


def to_dict(summary: Summary) -> dict[str, Any]:
    """The SARIF log as plain data."""
    index = {rule.code: i for i, rule in enumerate(summary.rules)}
    notifications = [
        {
            "level": "warning",
            "message": {"text": f"skipped: {f.result.skipped_reason}"},
            "locations": [{"physicalLocation": {"artifactLocation": _artifact(f.result.display_path)}}],
        }
        for f in summary.skipped
    ]
    return {
        "$schema": SARIF_SCHEMA_URI,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "tpu-agent",
                        "semanticVersion": __version__,
                        "version": __version__,
                        "informationUri": INFORMATION_URI,
                        "rules": [_descriptor(rule) for rule in summary.rules],
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().as_uri().rstrip("/") + "/"}},
                "invocations": [{"executionSuccessful": True, "toolExecutionNotifications": notifications}],
                "columnKind": "unicodeCodePoints",
                "results": [_result(f, index[f.code]) for f in summary.findings],
            }
        ],
    }


def render(summary: Summary) -> str:
    return json.dumps(to_dict(summary), indent=2) + "\n"
