"""The numbers every report format shows, computed once from a plan.

HIPIFY taught users to expect a conversion percentage: of the CUDA-specific references found, how many
the tool converted. These statistics carry that figure per file and in total, next to the rewritten
sites per rule, the items left for a person, the files skipped (with why) and the files the prefilter
dismissed without parsing. Renderers only format a :class:`Summary`; none recounts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tpu_agent.migrate.model import FileResult, Finding, Plan, Rule, Safety
from tpu_agent.migrate.rules import ALL_RULES


def percent(converted: int, references: int) -> float | None:
    """Share of references converted, in percent with one decimal; None when there was nothing to convert."""
    return round(100.0 * converted / references, 1) if references else None


@dataclass(frozen=True)
class RuleStats:
    """How often one rule matched in the plan and how many of those sites the plan rewrites."""

    code: str
    rule: Rule | None  # None only for a code the rule registry does not know
    safety: Safety  # as the findings carry it
    found: int
    fixed: int

    @property
    def name(self) -> str:
        return self.rule.name if self.rule else self.code


@dataclass(frozen=True)
class FileStats:
    """One examined file: its status, its references and how many were converted."""

    result: FileResult
    references: int
    converted: int
    by_rule: dict[str, tuple[int, int]]  # code -> (found, fixed)

    @property
    def status(self) -> str:
        if self.result.skipped_reason is not None:
            return "skipped"
        if self.result.prefiltered:
            return "prefiltered"
        return "changed" if self.result.changed else "unchanged"

    @property
    def conversion_percent(self) -> float | None:
        return percent(self.converted, self.references)


@dataclass(frozen=True)
class Totals:
    files_examined: int
    files_parsed: int
    files_prefiltered: int
    files_skipped: int
    files_changed: int
    lines_examined: int
    lines_parsed: int
    lines_prefiltered: int
    references: int
    converted: int
    unconverted_unsafe: int  # fixable with --unsafe-fixes
    unconverted_manual: int  # a person must port these

    @property
    def unconverted(self) -> int:
        return self.references - self.converted

    @property
    def conversion_percent(self) -> float | None:
        return percent(self.converted, self.references)


@dataclass(frozen=True)
class Summary:
    plan: Plan
    totals: Totals
    rules: list[RuleStats]  # rules that matched at least once, by code
    files: list[FileStats]  # every file, in plan order
    findings: list[Finding]  # every finding, by path, line, column
    manual: list[Finding]  # the findings the plan does not fix, same order

    @property
    def reported_files(self) -> list[FileStats]:
        """Files worth a row in a per-file table: parsed ones with findings, and skipped ones."""
        return [f for f in self.files if f.references or f.status == "skipped"]

    @property
    def skipped(self) -> list[FileStats]:
        return [f for f in self.files if f.status == "skipped"]

    @property
    def needs_attention(self) -> bool:
        """True when applying would change something or a person still has work: what ``--check`` fails on."""
        return bool(self.plan.changed_files or self.manual)


def _sort_key(finding: Finding) -> tuple[str, int, int, str]:
    return (finding.path, finding.line, finding.column, finding.code)


def summarize(plan: Plan) -> Summary:
    """Count everything the reports show, once."""
    files: list[FileStats] = []
    found: Counter[str] = Counter()
    fixed: Counter[str] = Counter()
    safety: dict[str, Safety] = {}
    for result in plan.files:
        per_rule_found = Counter(f.code for f in result.findings)
        per_rule_fixed = Counter(f.code for f in result.findings if f.fixed)
        found.update(per_rule_found)
        fixed.update(per_rule_fixed)
        for finding in result.findings:
            safety.setdefault(finding.code, finding.safety)
        files.append(
            FileStats(
                result=result,
                references=result.cuda_references,
                converted=result.converted_references,
                by_rule={code: (n, per_rule_fixed[code]) for code, n in sorted(per_rule_found.items())},
            )
        )
    findings = sorted(plan.findings, key=_sort_key)
    manual = [f for f in findings if not f.fixed]
    parsed = [f for f in files if f.status in ("changed", "unchanged")]
    prefiltered = [f for f in files if f.status == "prefiltered"]
    totals = Totals(
        files_examined=len(files),
        files_parsed=len(parsed),
        files_prefiltered=len(prefiltered),
        files_skipped=sum(1 for f in files if f.status == "skipped"),
        files_changed=sum(1 for f in files if f.status == "changed"),
        lines_examined=sum(f.result.lines for f in files),
        lines_parsed=sum(f.result.lines for f in parsed),
        lines_prefiltered=sum(f.result.lines for f in prefiltered),
        references=len(findings),
        converted=len(findings) - len(manual),
        unconverted_unsafe=sum(1 for f in manual if f.safety == Safety.UNSAFE),
        unconverted_manual=sum(1 for f in manual if f.safety != Safety.UNSAFE),
    )
    rules = [RuleStats(code, ALL_RULES.get(code), safety[code], found[code], fixed[code]) for code in sorted(found)]
    return Summary(plan=plan, totals=totals, rules=rules, files=files, findings=findings, manual=manual)
