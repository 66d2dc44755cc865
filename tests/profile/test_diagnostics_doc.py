"""docs/diagnostics.md is generated from the diagnostic records and must stay in step with them; every
reference a record gives is a public URL or a document shipped in docs/ (with the section it names).

Regenerate with ``TPU_AGENT_REGEN_FIXTURES=1 pytest tests/profile/test_diagnostics_doc.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tpu_agent.profile.rules import ALL_RULES

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "diagnostics.md"
_FENCE = "```"
_DATA = {
    "steps": "step markers",
    "op_trace": "an op trace with shapes",
    "hooks": "a `tpu-agent profile` capture",
    "eager_mode": "the eager mode",
    "memory": "a memory measurement",
    "compiled": "the step compiled by libtpu",
}


def render() -> str:
    out = [
        "# tpu-agent profile diagnostics",
        "",
        "Generated from `tpu_agent.profile.rules.ALL_RULES` (do not edit by hand; see "
        "tests/profile/test_diagnostics_doc.py).",
        "`tpu-agent profile` and `tpu-agent diagnose` run every diagnostic on every capture; one without the data it",
        "needs reports `insufficient_data` instead of a verdict. Severity is the usual one: a check raises or lowers",
        "it with what it measured. Explain one with `tpu-agent rules CODE` (e.g. `tpu-agent rules HS-1`); the",
        "background is in [tpu-performance.md](tpu-performance.md).",
        "",
        "| Code | Name | Category | Severity | Needs |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| [{r.code}](#{r.code.lower()}) | {r.name} | {r.category} | {r.severity.value} | "
        f"{', '.join(_DATA[d] for d in r.requires) or 'nothing'} |"
        for r in ALL_RULES.values()
    ]
    for r in ALL_RULES.values():
        out += ["", f"## {r.code}", "", f"`{r.name}`, {r.category}, {r.severity.value}", "", r.rationale]
        out += [
            "",
            "Before:",
            "",
            f"{_FENCE}python",
            r.before,
            _FENCE,
            "",
            "After:",
            "",
            f"{_FENCE}python",
            r.after,
            _FENCE,
        ]
        out += ["", f"Reference: {r.reference}"]
    return "\n".join(out) + "\n"


def test_diagnostics_doc_is_current() -> None:
    if os.environ.get("TPU_AGENT_REGEN_FIXTURES"):
        DOC.write_text(render(), encoding="utf-8")
    assert DOC.read_text(encoding="utf-8") == render()


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


@pytest.mark.parametrize("rule_id", list(ALL_RULES))
def test_reference_is_public_or_shipped(rule_id: str) -> None:
    for reference in ALL_RULES[rule_id].references:
        if reference.startswith("https://"):
            continue
        document, _, anchor = reference.partition("#")
        path = REPO / document
        assert document.startswith("docs/") and path.is_file(), reference
        headings = {
            _slug(line.lstrip("#").strip())
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")
        }
        assert not anchor or anchor in headings, f"{reference}: no section {anchor!r} in {document}"
