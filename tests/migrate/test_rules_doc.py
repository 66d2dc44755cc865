"""docs/rules.md is generated from ALL_RULES and must stay in step with it.

Regenerate with ``TPU_AGENT_REGEN_FIXTURES=1 pytest tests/migrate/test_rules_doc.py``.
"""

from __future__ import annotations

from pathlib import Path

from conftest import REGEN

from tpu_agent.migrate.model import Rule
from tpu_agent.migrate.rules import ALL_RULES, FAMILIES

DOC = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
_FENCE = "```"


def render() -> str:
    out = [
        "# tpu-agent migrate rules",
        "",
        "Generated from `tpu_agent.migrate.rules.ALL_RULES` (do not edit by hand; see tests/migrate/test_rules_doc.py).",
        "Safety: **safe** fixes are applied by default, **unsafe** ones only with `--unsafe-fixes`, **manual** items",
        "are reported (and annotated with `--annotate`) for a person to port. Select or ignore rules by code prefix",
        "(`--select TPU2`, `--ignore TPU104`).",
        "",
        "| Code | Name | Family | Safety | Finds |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| [{r.code}](#{r.code.lower()}) | {r.name} | {r.family} | {_safety(r)} | {r.summary.replace('|', '/')} |"
        for r in ALL_RULES.values()
    ]
    for family in FAMILIES:
        out += ["", f"## {family.name}"]
        for r in family.rules:
            out += [
                "",
                f"### {r.code}",
                "",
                f"`{r.name}`, {_safety(r)}" + (f", needs torch >= {r.since_torch}" if r.since_torch else ""),
                "",
            ]
            out += [r.summary, "", r.rationale, "", "Before:", "", f"{_FENCE}", r.before, _FENCE]
            if r.after:
                out += ["", "After:", "", _FENCE, r.after, _FENCE]
            out += ["", "References: " + ", ".join(_link(ref) for ref in r.references)]
    return "\n".join(out) + "\n"


def _safety(rule: Rule) -> str:
    """The safety tier, with the tpu target's where it differs."""
    if rule.tpu_safety is None:
        return rule.safety.value
    return f"{rule.safety.value} ({rule.tpu_safety.value} for `--target tpu`)"


def _link(reference: str) -> str:
    """A public URL as an autolink; a section of a doc shipped in docs/ as a link relative to docs/rules.md."""
    if reference.startswith("https://"):
        return f"<{reference}>"
    relative = reference.removeprefix("docs/")
    return f"[{relative}]({relative})"


def test_every_reference_can_be_followed() -> None:
    """Each rule cites public URLs and a section of the migration guide that exists (no private notes)."""
    repo = DOC.parents[1]
    for rule in ALL_RULES.values():
        assert rule.references, rule.code
        assert any(ref.startswith("docs/") for ref in rule.references), rule.code
        for ref in rule.references:
            if ref.startswith("https://"):
                continue
            path, _, anchor = ref.partition("#")
            doc = repo / path
            assert path.startswith("docs/") and doc.is_file(), (rule.code, ref)
            headings = {_anchor(line) for line in doc.read_text(encoding="utf-8").splitlines() if line.startswith("#")}
            assert anchor in headings, (rule.code, ref)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.lstrip("#").strip().lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def test_rules_doc_is_current() -> None:
    if REGEN:
        DOC.parent.mkdir(exist_ok=True)
        DOC.write_text(render(), encoding="utf-8")
    assert DOC.read_text(encoding="utf-8") == render()
