"""Every rule against its fixture pairs (TorchFix style): expected output, expected findings, idempotence."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, REGEN, FixtureCase, finding_rows, fixture_cases, migrate_one, regenerate

from tpu_agent.errors import TpuAgentError
from tpu_agent.migrate.model import Safety
from tpu_agent.migrate.rules import ALL_RULES, get_rule

CASES = fixture_cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{c.stem}.{c.ext}" for c in CASES])
def test_fixture(case: FixtureCase, tmp_path: Path) -> None:
    result = migrate_one(case.source, **_kwargs(case))
    assert result.skipped_reason is None
    if REGEN:
        regenerate(case, result)
    original = case.source.read_bytes()
    new = result.migrated_bytes if result.migrated_bytes is not None else original
    if case.expected_output.exists():
        assert result.migrated_bytes is not None, "expected a change"
        assert new.decode() == case.expected_output.read_text(encoding="utf-8")
    else:
        assert result.migrated_bytes is None, "unexpected change: add a .out file or fix the rule"
    assert finding_rows(result) == json.loads(case.expected_findings.read_text())
    # the fixture exercises its own rule
    assert any(f.code == case.code for f in result.findings)
    # manual findings are never fixed; unsafe ones only with unsafe fixes
    for finding in result.findings:
        if finding.safety is Safety.MANUAL:
            assert not finding.fixed
        if finding.safety is Safety.UNSAFE and "unsafe" not in case.flags:
            assert not finding.fixed
    if case.ext == "py":
        ast.parse(new)
    # idempotent: the migrated file migrates to itself
    again = tmp_path / case.source.name
    again.write_bytes(new)
    second = migrate_one(again, **_kwargs(case))
    assert second.migrated_bytes is None, second.migrated_bytes.decode()


def _kwargs(case: FixtureCase) -> dict[str, object]:
    options = case.options()
    return {"target": options.target, "unsafe_fixes": options.unsafe_fixes, "annotate": options.annotate}


def test_every_rule_has_a_fixture() -> None:
    covered = {case.code for case in CASES}
    assert set(ALL_RULES) <= covered, sorted(set(ALL_RULES) - covered)


def test_every_fixture_has_expected_findings() -> None:
    stems = [case.stem for case in CASES]
    assert len(stems) == len(set(stems)), "two fixtures share a stem (and so their expected files)"
    for case in CASES:
        assert case.expected_findings.exists(), case.expected_findings.name
    names = {p.name for p in Path(CASES[0].source.parent).iterdir()}
    for name in names:
        if ".out." in name or name.endswith(".findings.json"):
            stem = name.split(".out.")[0] if ".out." in name else name[: -len(".findings.json")]
            assert stem in stems, f"orphan expected file {name}"


def test_rules_are_well_formed() -> None:
    for code, rule in ALL_RULES.items():
        assert rule.code == code
        assert code[:4] == "TPU" + code[3] and len(code) == 6
        assert rule.name and rule.summary and rule.rationale and rule.reference
        assert rule.before
        family_digit = {
            "devices": "1",
            "cuda-api": "2",
            "amp": "3",
            "distributed": "4",
            "compile": "5",
            "backend-flags": "6",
            "env-vars": "7",
            "third-party": "8",
        }[rule.family]
        assert code[3] == family_digit, code
    names = [rule.name for rule in ALL_RULES.values()]
    assert len(names) == len(set(names))


def test_get_rule() -> None:
    assert get_rule("tpu101").code == "TPU101"
    with pytest.raises(TpuAgentError) as info:
        get_rule("TPU999")
    assert "TPU999" in info.value.message


def test_cli_fixture_copy_keeps_name(tmp_path: Path) -> None:
    # kinds come from the file name: a copied fixture is classified the same way
    source = next(c for c in CASES if c.ext == "Dockerfile").source
    copy = tmp_path / "Dockerfile"
    shutil.copy(source, copy)
    assert migrate_one(copy).findings


@pytest.mark.slow
def test_family_order_does_not_change_any_result() -> None:
    """Claims, not the order of FAMILIES, decide which family handles a call: reversed, every Python fixture
    migrates to the same text with the same findings."""
    from tpu_agent.migrate.engine.dispatch import Dispatch
    from tpu_agent.migrate.engine.pypass import migrate_source
    from tpu_agent.migrate.engine.worker import dispatch
    from tpu_agent.migrate.rules import FAMILIES

    reversed_dispatch = Dispatch.from_families(list(reversed(FAMILIES)))
    for case in CASES:
        if case.ext != "py":
            continue
        source = case.source.read_text(encoding="utf-8")
        options = case.options()
        forward = migrate_source(source, options, ALL_RULES, dispatch())
        backward = migrate_source(source, options, ALL_RULES, reversed_dispatch)
        assert forward.code == backward.code, case.source.name
        assert forward.findings == backward.findings, case.source.name


def test_no_two_fixture_inputs_are_copies() -> None:
    """A variant (other options, same input) is a set of expected files next to the one input, never a copy."""

    seen: dict[bytes, str] = {}
    for path in sorted(FIXTURES.glob("*.in.*")):
        data = path.read_bytes()
        assert data not in seen, f"{path.name} is a copy of {seen[data]}: name its expected files after that input"
        seen[data] = path.name
