"""The `profile` and `diagnose` commands end to end: formats, exit codes, steps, ranks, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from profile_helpers import REPO, SCRIPTS, Captures, run_cli

pytestmark = pytest.mark.slow  # every test here launches `tpu-agent` (and torch) in a subprocess


def test_annotated_inference_steps(captures: Captures) -> None:
    _, report, _ = captures.get("inference_steps.py")
    assert report["step_time"]["count"] == 5
    assert {s["index"] for s in report["steps"] if s["in_window"]} == {2, 3, 4, 5, 6}
    assert "CAP-1" not in {f["rule_id"] for f in report["findings"]}


def test_no_steps_is_reported_and_exits_one(captures: Captures) -> None:
    _, report, result = captures.get("inference_steps.py", args=("--no-steps",))
    assert report["capture"]["exit_code"] == 0
    assert [f["rule_id"] for f in report["findings"] if f["severity"] == "error"] == ["CAP-1"]
    assert result.returncode == 1


def test_two_ranks_one_xplane_each_with_collectives(captures: Captures) -> None:
    logdir, report, result = captures.get("two_ranks.py", "--nproc", "2")
    assert report["capture"]["exit_code"] == 0, result.stderr[-2000:]
    assert report["capture"]["ranks"] == [0, 1]
    names = sorted(Path(p).name for p in report["capture"]["xplane_files"])
    assert len(names) == 2 and names[0].endswith("_0.xplane.pb") and names[1].endswith("_1.xplane.pb")
    for rank in (0, 1):
        events = (logdir / "tpu-agent" / "raw" / f"events-rank{rank}.jsonl").read_text().splitlines()
        assert sum('"kind":"collective"' in e for e in events) >= 2 * 8
    # the ranks averaged their gradients by hand: SD-7 (ranks that train alone) looked and found nothing
    assert next(r for r in report["rules"] if r["rule_id"] == "SD-7")["status"] == "ok"


def test_diagnose_rerenders_markdown_and_writes_output(captures: Captures, tmp_path: Path) -> None:
    logdir, report, _ = captures.get("host_sync.py")
    out = tmp_path / "report.md"
    result = run_cli("diagnose", str(logdir), "--format", "markdown", "--output", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert text.startswith("# tpu-agent profile report") and "### HS-1 (warning)" in text and "```diff" in text
    again = json.loads(run_cli("diagnose", str(logdir), "--format", "json").stdout)
    assert [f["rule_id"] for f in again["findings"]] == [f["rule_id"] for f in report["findings"]]


def test_text_format_shows_findings_table(captures: Captures) -> None:
    logdir, _, _ = captures.get("host_sync.py")
    result = run_cli("diagnose", str(logdir))
    assert "Findings" in result.stdout and "HS-1" in result.stdout and "Step time estimate" in result.stdout


def test_json_stdout_stays_clean_when_the_script_prints(captures: Captures) -> None:
    _, report, result = captures.get("host_sync.py")
    assert "mean loss" in result.stderr and result.stdout.lstrip().startswith("{")


def test_bad_input_errors(tmp_path: Path) -> None:
    result = run_cli("diagnose", str(tmp_path / "missing"), "--format", "json")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["code"] == "no-logdir"
    result = run_cli("profile", "--logdir", str(tmp_path / "x"), str(tmp_path / "missing.py"))
    assert result.returncode == 2 and "missing.py" in result.stderr
    result = run_cli("profile", "--steps", "0", str(SCRIPTS / "host_sync.py"))
    assert result.returncode == 2


def test_every_report_matches_the_published_schema(captures: Captures, tmp_path: Path) -> None:
    import jsonschema

    from tpu_agent.profile.synthetic import write_capture

    schema = json.loads((REPO / "tpu_agent" / "profile" / "report" / "schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for script in ("host_sync.py", "memory_fit.py", "slow_loader.py"):
        options = ("--chip", "v5e") if script == "memory_fit.py" else ()
        _, report, _ = captures.get(script, *options)
        jsonschema.validate(report, schema)
    write_capture(tmp_path, steps=20)
    jsonschema.validate(json.loads(run_cli("diagnose", str(tmp_path), "--format", "json").stdout), schema)
