"""`tpu-agent rules` covers the profile diagnostics as well as the migration rules.

The command only reads rule records, so it runs in this process (typer's test runner): a fresh interpreter would add
a second of start-up per call and nothing these tests check."""

from __future__ import annotations

import json

from click.testing import Result
from typer.testing import CliRunner

from tpu_agent.profile.rules import ALL_RULES


def run_rules(*args: str) -> Result:
    from tpu_agent.cli import app

    return CliRunner().invoke(app, ["rules", *args])


def test_rules_lists_diagnostics_next_to_migration_rules() -> None:
    table = run_rules()
    assert table.exit_code == 0, table.output
    assert "profile diagnostics" in table.stdout and "migration rules" in table.stdout
    for rule_id in ALL_RULES:
        assert rule_id in table.stdout
    listed = json.loads(run_rules("--format", "json").stdout)
    diagnostics = [r for r in listed if r["kind"] == "diagnostic"]
    assert [r["code"] for r in diagnostics] == list(ALL_RULES)
    assert {"code", "name", "category", "severity", "rationale", "before", "after", "reference", "requires"} <= set(
        diagnostics[0]
    )
    assert {r["kind"] for r in listed} == {"migration", "diagnostic"}


def test_rules_explains_one_diagnostic() -> None:
    rule = ALL_RULES["SH-1"]
    result = run_rules("sh-1")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    for part in (rule.code, rule.name, "Why", "Before", "After", "Reference", rule.before):
        assert " ".join(part.split()) in text
    record = json.loads(run_rules("HS-1", "--format", "json").stdout)
    assert record["kind"] == "diagnostic" and record["code"] == "HS-1" and record["reference"].startswith("docs/")


def test_unknown_code_names_it_and_exits_2() -> None:
    result = run_rules("HS-99")
    assert result.exit_code == 2 and "HS-99" in result.stderr
