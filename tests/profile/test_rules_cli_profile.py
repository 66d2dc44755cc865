"""`tpu-agent rules` covers the profile diagnostics as well as the migration rules."""

from __future__ import annotations

import json

import pytest
from profile_helpers import run_cli

from tpu_agent.profile.rules import ALL_RULES

pytestmark = pytest.mark.slow  # every test here launches `tpu-agent` (and torch) in a subprocess


def test_rules_lists_diagnostics_next_to_migration_rules() -> None:
    table = run_cli("rules")
    assert table.returncode == 0, table.stderr
    assert "profile diagnostics" in table.stdout and "migration rules" in table.stdout
    for rule_id in ALL_RULES:
        assert rule_id in table.stdout
    listed = json.loads(run_cli("rules", "--format", "json").stdout)
    diagnostics = [r for r in listed if r["kind"] == "diagnostic"]
    assert [r["code"] for r in diagnostics] == list(ALL_RULES)
    assert {"code", "name", "category", "severity", "rationale", "before", "after", "reference", "requires"} <= set(
        diagnostics[0]
    )
    assert {r["kind"] for r in listed} == {"migration", "diagnostic"}


def test_rules_explains_one_diagnostic() -> None:
    rule = ALL_RULES["SH-1"]
    result = run_cli("rules", "sh-1")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for part in (rule.code, rule.name, "Why", "Before", "After", "Reference", rule.before):
        assert " ".join(part.split()) in text
    record = json.loads(run_cli("rules", "HS-1", "--format", "json").stdout)
    assert record["kind"] == "diagnostic" and record["code"] == "HS-1" and record["reference"].startswith("docs/")


def test_unknown_code_names_it_and_exits_2() -> None:
    result = run_cli("rules", "HS-99")
    assert result.returncode == 2 and "HS-99" in result.stderr
