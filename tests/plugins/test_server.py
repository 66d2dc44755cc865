"""The MCP server in process, through the SDK's real client: schemas, annotations, errors, the migrate flow."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcp import Client
from mcp.types import ListRootsResult, Root
from mcp_helpers import tool_content, tool_error

from tpu_agent.plugins.server import build_server

pytestmark = pytest.mark.anyio

TOOLS = {
    # name: (read_only, destructive, idempotent)
    "tpu_doctor": (True, False, True),
    "tpu_scan": (True, False, True),
    "tpu_plan_migration": (True, False, True),
    "tpu_apply_plan": (False, True, True),
    "tpu_run": (False, False, False),
    "tpu_profile": (False, False, False),
    "tpu_estimate": (False, False, False),
    "tpu_check": (False, False, False),
    "tpu_job_status": (True, False, True),
    "tpu_job_cancel": (False, True, True),
    "tpu_diagnose": (True, False, True),
    "tpu_explain_rule": (True, False, True),
    "tpu_lookup_api": (True, False, True),
}


@pytest.fixture(params=["auto", "legacy"])
async def client(request: pytest.FixtureRequest, example: Path) -> AsyncIterator[Client]:
    async with Client(build_server(str(example)), mode=request.param) as c:
        yield c


@pytest.fixture
async def modern(example: Path) -> AsyncIterator[Client]:
    async with Client(build_server(str(example)), mode="auto") as c:
        yield c


def _tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".tpu-agent" not in p.relative_to(root).parts
    }


async def test_tools_are_namespaced_typed_and_annotated(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == set(TOOLS)
    for name, (read_only, destructive, idempotent) in TOOLS.items():
        tool = tools[name]
        assert tool.description and len(tool.description) > 60
        ann = tool.annotations
        assert (ann.read_only_hint, ann.destructive_hint, ann.idempotent_hint) == (
            read_only,
            destructive,
            idempotent,
        ), name
        assert ann.open_world_hint is False
        assert tool.output_schema and tool.output_schema["type"] == "object", name
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)
    run = tools["tpu_run"].input_schema
    assert run["required"] == ["entrypoint"]
    assert run["properties"]["wait_s"]["maximum"] <= 50  # returns before a host's 60 s tool timeout
    backend = json.dumps(run["properties"]["backend"])
    assert all(choice in backend for choice in ("auto", "torch_tpu", "emulated"))
    assert "workspace" in tools["tpu_scan"].input_schema["properties"]


async def test_lookup_and_structured_output_match_the_schema(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    result = await client.call_tool("tpu_lookup_api", {"query": "torch.cuda.synchronize"})
    assert not result.is_error
    jsonschema.validate(result.structured_content, tools["tpu_lookup_api"].output_schema)
    first = result.structured_content["matches"][0]
    assert first["cuda"] == "torch.cuda.synchronize()" and first["tpu"] == "torch.accelerator.synchronize()"
    assert json.loads(result.content[0].text) == result.structured_content
    scaler = await client.call_tool("tpu_lookup_api", {"query": "GradScaler"})
    assert "GradScaler" in scaler.structured_content["matches"][0]["cuda"]
    assert tool_error(await client.call_tool("tpu_lookup_api", {"query": "zzzqqq"}))["code"] == "unknown-api"


async def test_path_escapes_are_refused(client: Client, example: Path) -> None:
    outside = example.parent / "outside.py"
    outside.write_text("import torch\nx = torch.zeros(1).cuda()\n")
    os.symlink(outside, example / "sneaky.py")
    for paths in (["../outside.py"], [str(outside)], ["sneaky.py"], ["/etc"]):
        error = tool_error(await client.call_tool("tpu_scan", {"paths": paths}))
        assert error["code"] == "path-outside-workspace" and error["hint"], paths
    error = tool_error(await client.call_tool("tpu_run", {"entrypoint": "../outside.py"}))
    assert error["code"] == "path-outside-workspace"
    error = tool_error(await client.call_tool("tpu_diagnose", {"logdir": "../.."}))
    assert error["code"] == "path-outside-workspace"


async def test_malformed_arguments_are_answered_and_the_server_lives_on(client: Client) -> None:
    for name, args in (
        ("tpu_scan", {"paths": "train.py"}),  # not a list
        ("tpu_scan", {"paths": []}),  # empty
        ("tpu_run", {}),  # missing entrypoint
        ("tpu_run", {"entrypoint": "train.py", "wait_s": 3600}),  # over the cap
        ("tpu_run", {"entrypoint": "train.py", "backend": "cuda"}),  # not a choice
        ("tpu_job_status", {"job_id": 42}),
    ):
        result = await client.call_tool(name, args)
        assert result.is_error, (name, args)
        assert name in result.content[0].text
    result = await client.call_tool("tpu_lookup_api", {"query": "nccl"})
    assert not result.is_error


async def test_actionable_errors_for_unknown_things(client: Client) -> None:
    assert tool_error(await client.call_tool("tpu_job_status", {"job_id": "run-00000000"}))["code"] == "unknown-job"
    assert tool_error(await client.call_tool("tpu_job_cancel", {"job_id": "run-00000000"}))["code"] == "unknown-job"
    assert (
        tool_error(await client.call_tool("tpu_apply_plan", {"plan_id": "plan-000000000000"}))["code"] == "unknown-plan"
    )
    for malformed in ({"plan_id": "../../etc"}, {"plan_id": "plan-" + "0" * 5000}):  # not an id: the schema refuses it
        refused = tool_error(await client.call_tool("tpu_apply_plan", malformed))
        assert refused["code"] == "invalid-argument" and "plan_id" in refused["message"]
        assert "0" * 200 not in refused["message"]  # an oversized id is not echoed back
    assert tool_error(await client.call_tool("tpu_run", {"entrypoint": "README.md"}))["code"] == "bad-entrypoint"
    assert tool_error(await client.call_tool("tpu_diagnose", {}))["code"] == "no-profile"
    error = tool_error(await client.call_tool("tpu_explain_rule", {"code": "TPU999"}))
    assert error["code"] and error["hint"]


async def test_no_workspace_is_refused_not_guessed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with Client(build_server(None)) as c:
        error = tool_error(await c.call_tool("tpu_scan", {}))
        assert error["code"] == "no-workspace" and "workspace=" in error["hint"]
        doctor = await c.call_tool("tpu_doctor", {})
        assert not doctor.is_error  # the doctor reports it instead of failing
        assert "no-workspace" in [p["code"] for p in doctor.structured_content["problems"]]
        ok = await c.call_tool("tpu_scan", {"paths": ["."], "workspace": str(tmp_path)})
        assert not ok.is_error and ok.structured_content["workspace"] == str(tmp_path.resolve())


async def test_mcp_roots_are_the_last_resort(example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    async def roots(context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=example.resolve().as_uri(), name="project")])

    async with Client(build_server(None), mode="legacy", list_roots_callback=roots) as c:
        doctor = (await c.call_tool("tpu_doctor", {})).structured_content
        assert (doctor["workspace"], doctor["workspace_source"]) == (str(example.resolve()), "roots")
        scan = await c.call_tool("tpu_scan", {"paths": ["train.py"]})
        assert not scan.is_error and scan.structured_content["findings"]
    async with Client(build_server(str(tmp_path)), mode="legacy", list_roots_callback=roots) as c:
        doctor = (await c.call_tool("tpu_doctor", {})).structured_content
        assert doctor["workspace_source"] == "--workspace"  # roots never override an explicit workspace


async def test_rule_explanation_and_resources(modern: Client) -> None:
    catalogue = json.loads((await modern.read_resource("tpu-agent://rules")).contents[0].text)
    assert catalogue and {"code", "name", "safety", "before", "after"} <= set(catalogue[0])
    code = catalogue[0]["code"]
    explained = await modern.call_tool("tpu_explain_rule", {"code": code.lower()})
    assert not explained.is_error and explained.structured_content["code"] == code
    assert explained.structured_content == {k: catalogue[0][k] for k in explained.structured_content}


async def test_prompts_teach_the_workflow(modern: Client) -> None:
    names = {p.name for p in (await modern.list_prompts()).prompts}
    assert names == {"migrate_to_tpu", "why_is_my_tpu_step_slow"}
    migrate = (await modern.get_prompt("migrate_to_tpu", {"path": "src"})).messages[0].content.text
    assert "`src`" in migrate and "tpu_plan_migration" in migrate and "approval" in migrate
    slow = (await modern.get_prompt("why_is_my_tpu_step_slow", {})).messages[0].content.text
    assert "tpu_profile" in slow and "tpu_diagnose" in slow


async def test_scan_plan_apply_apply_again_and_stale(modern: Client, example: Path) -> None:
    before = _tree(example)
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    scan = await modern.call_tool("tpu_scan", {"paths": ["."]}, progress_callback=on_progress)
    assert not scan.is_error, scan.content[0].text
    found = scan.structured_content
    assert found["findings"] and found["files_with_findings"] >= 3
    assert progress == sorted(progress) and len(set(progress)) == len(progress)
    assert {f["location"]["path"] for f in found["findings"]} >= {"train.py", "launch.sh"}
    assert all(not f["location"]["path"].startswith("/") for f in found["findings"])
    assert sum(found["rule_counts"].values()) >= len(found["findings"])

    plan = (await modern.call_tool("tpu_plan_migration", {"paths": ["."]})).structured_content
    assert _tree(example) == before  # planning touches no source file
    assert plan["plan_id"].startswith("plan-") and (example / plan["plan_path"]).is_file()
    assert "--- a/train.py" in plan["diff"] and "+++ b/train.py" in plan["diff"]
    assert plan["file_hashes"]["train.py"] == before["train.py"]
    assert plan["report"] and plan["manual_followups"]  # the Triton kernel needs a person
    diff = (await modern.read_resource(plan["diff_uri"])).contents[0].text
    assert diff.startswith(plan["diff"][:200])
    again = (await modern.call_tool("tpu_plan_migration", {"paths": ["."]})).structured_content
    assert again["plan_id"] == plan["plan_id"]  # same tree, same plan

    applied = (await modern.call_tool("tpu_apply_plan", {"plan_id": plan["plan_id"]})).structured_content
    assert applied["applied"] and not applied["already_applied"]
    assert sorted(applied["files_written"]) == sorted(c["path"] for c in plan["files_changed"])
    after = _tree(example)
    for changed in plan["files_changed"]:
        assert after[changed["path"]] == changed["sha256_after"]
    second = (await modern.call_tool("tpu_apply_plan", {"plan_id": plan["plan_id"]})).structured_content
    assert not second["applied"] and second["already_applied"] and second["files_written"] == []
    assert _tree(example) == after

    # A file edited after planning: the new plan refuses to apply instead of clobbering the edit.
    (example / "data.py").write_text(
        (example / "data.py").read_text().replace("import torch", "import torch  # edited", 1)
    )
    (example / "extra.py").write_text("import torch\nx = torch.zeros(2, device='cuda')\n")
    fresh = (await modern.call_tool("tpu_plan_migration", {"paths": ["extra.py"]})).structured_content
    (example / "extra.py").write_text("import torch\nx = torch.ones(2, device='cuda')\n")
    stale = tool_error(await modern.call_tool("tpu_apply_plan", {"plan_id": fresh["plan_id"]}))
    assert stale["code"] == "stale-plan" and "extra.py" in stale["message"]
    assert "ones" in (example / "extra.py").read_text()
    assert not (example / ".git").exists() or _tree(example / ".git")  # nothing created under .git/


async def test_uncommitted_files_need_the_users_consent(modern: Client, example: Path) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(example)], check=True)
    plan = (await modern.call_tool("tpu_plan_migration", {"paths": ["train.py"]})).structured_content
    refused = tool_error(await modern.call_tool("tpu_apply_plan", {"plan_id": plan["plan_id"]}))
    assert refused["code"] == "dirty-worktree" and "allow_dirty=true" in refused["hint"]
    assert "--allow-dirty" not in refused["hint"]
    applied = (
        await modern.call_tool("tpu_apply_plan", {"plan_id": plan["plan_id"], "allow_dirty": True})
    ).structured_content
    assert applied["files_written"] == ["train.py"]
    assert not any((example / ".git").rglob("*.tpu-agent-tmp"))


@pytest.mark.slow
async def test_run_status_and_cancel(modern: Client, example: Path) -> None:
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    result = await modern.call_tool(
        "tpu_run", {"entrypoint": "train.py", "args": ["--steps", "2"], "wait_s": 50}, progress_callback=on_progress
    )
    job = result.structured_content
    assert not result.is_error and job["kind"] == "run"
    if job["state"] == "running":
        job = (await modern.call_tool("tpu_job_status", {"job_id": job["job_id"], "wait_s": 50})).structured_content
    assert job["state"] == "succeeded" and job["exit_code"] == 0, job["log_tail"]
    assert any(line.startswith("step 1 loss") for line in job["log_tail"])
    assert progress  # progress notifications while the call was open
    assert job["command"][1:4] == ["-m", "tpu_agent", "run"] and (example / job["log_path"]).is_file()
    log = (await modern.read_resource(job["log_uri"])).contents[0].text
    assert "step 1 loss" in log

    long = (
        await modern.call_tool("tpu_run", {"entrypoint": "train.py", "args": ["--steps", "100000"], "wait_s": 0})
    ).structured_content
    assert long["state"] == "running"
    cancelled = (await modern.call_tool("tpu_job_cancel", {"job_id": long["job_id"]})).structured_content
    assert cancelled == {"job_id": long["job_id"], "state": "cancelled", "was_running": True}
    status = (await modern.call_tool("tpu_job_status", {"job_id": long["job_id"]})).structured_content
    assert status["state"] == "cancelled"


TINY_TPU_SCRIPT = """\
import torch

device = torch.device("tpu")
model = torch.nn.Linear(16, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(12):
    x = torch.randn(8, 16, device=device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
"""


@pytest.mark.slow
async def test_profile_then_diagnose(modern: Client, example: Path) -> None:
    (example / "tiny.py").write_text(TINY_TPU_SCRIPT)
    job = (
        await modern.call_tool("tpu_profile", {"entrypoint": "tiny.py", "steps": 8, "warmup": 2, "wait_s": 50})
    ).structured_content
    if job["state"] == "running":
        job = (await modern.call_tool("tpu_job_status", {"job_id": job["job_id"], "wait_s": 50})).structured_content
    assert job["state"] == "succeeded", job["log_tail"]
    assert job["profile_dir"] == f".tpu-agent/profiles/{job['job_id']}"
    assert (example / job["profile_dir"] / "plugins" / "profile").is_dir()  # an XProf session
    diagnosis = (await modern.call_tool("tpu_diagnose", {"job_id": job["job_id"]})).structured_content
    assert diagnosis["logdir"] == job["profile_dir"] and diagnosis["report"]
    rules = {f["rule"] for f in diagnosis["findings"]}
    assert "PR-1" in rules  # fp32 matmuls on a bf16 machine
    for finding in diagnosis["findings"]:
        assert finding["suggested_change"] and finding["severity"] in {"error", "warning", "info"}
        assert all(not loc.startswith("/") for loc in finding["locations"])
    assert any(loc.startswith("tiny.py:") for f in diagnosis["findings"] for loc in f["locations"])
    newest = (await modern.call_tool("tpu_diagnose", {})).structured_content  # default: the newest profile
    assert newest["logdir"] == job["profile_dir"]
    run_job = (await modern.call_tool("tpu_run", {"entrypoint": "tiny.py", "wait_s": 0})).structured_content
    error = tool_error(await modern.call_tool("tpu_diagnose", {"job_id": run_job["job_id"]}))
    assert error["code"] == "not-a-profile-job"
    await modern.call_tool("tpu_job_cancel", {"job_id": run_job["job_id"]})
    busy = (await modern.call_tool("tpu_profile", {"entrypoint": "tiny.py", "wait_s": 0})).structured_content
    assert tool_error(await modern.call_tool("tpu_diagnose", {"job_id": busy["job_id"]}))["code"] == "job-running"
    await modern.call_tool("tpu_job_cancel", {"job_id": busy["job_id"]})


@pytest.mark.slow  # a job: minutes where libtpu compiles
async def test_estimate_is_a_job_that_writes_the_estimate_or_names_the_missing_compiler(
    modern: Client, example: Path
) -> None:
    from tpu_agent.estimate.compiler import compiler_status

    (example / "tiny.py").write_text(TINY_TPU_SCRIPT)
    job = tool_content(await modern.call_tool("tpu_estimate", {"entrypoint": "tiny.py", "chip": "v5e-4", "wait_s": 50}))
    for _ in range(12):  # a compile for the slice takes minutes on a loaded 2-core machine
        if job["state"] != "running":
            break
        job = tool_content(await modern.call_tool("tpu_job_status", {"job_id": job["job_id"], "wait_s": 50}))
    command = job["command"]
    assert job["kind"] == "estimate" and command[3] == "estimate" and "--nproc" not in command
    assert command[command.index("--output") + 1].startswith(".tpu-agent/estimates/")
    if compiler_status().available:
        assert job["state"] == "succeeded", job["log_tail"]
        document = json.loads((example / job["estimate_path"]).read_text())
        assert document["estimate"]["target"] == "v5e-4" and document["estimate"]["verdict"] == "fits"
        assert job["estimate_path"] in job["next_action"]
    else:
        assert job["state"] == "failed" and job["exit_code"] == 2 and job["estimate_path"] is None
        assert any("tpu-agent[estimate]" in line for line in job["log_tail"]), job["log_tail"]


async def test_estimate_of_a_model_bigger_than_the_host_asks_for_capture_only(modern: Client, example: Path) -> None:
    (example / "tiny.py").write_text(TINY_TPU_SCRIPT)
    arguments = {
        "entrypoint": "tiny.py", "chip": "v5e-8", "strategy": "fsdp", "capture_only": True, "allow_partial": True,
        "wait_s": 0,
    }  # fmt: skip
    job = tool_content(await modern.call_tool("tpu_estimate", arguments))
    await modern.call_tool("tpu_job_cancel", {"job_id": job["job_id"]})
    command = job["command"]
    assert "--capture-only" in command and command[command.index("--strategy") + 1] == "fsdp"
    assert command[command.index("--effort") + 1] == "fast"  # the default effort, named for the job's record
    assert "--allow-partial" in command
    error = tool_error(await modern.call_tool("tpu_estimate", {"entrypoint": "tiny.py", "capture_only": "yes please"}))
    assert error["code"] == "invalid-argument"


COMPILED_SCRIPT = """\
import torch
from tpu_agent.runtime.xla import settings

double_sin = torch.compile(lambda x: (x * 2).sin().sum(), backend="tpu")
print("compiler", settings.compiler(), round(double_sin(torch.ones(4, device="tpu")).item(), 4))
"""


@pytest.mark.slow  # a job whose graph XLA compiles
async def test_jobs_take_the_graph_compiler(modern: Client, example: Path) -> None:
    (example / "compiled.py").write_text(COMPILED_SCRIPT)
    job = tool_content(
        await modern.call_tool("tpu_run", {"entrypoint": "compiled.py", "compiler": "xla", "wait_s": 50})
    )
    if job["state"] == "running":
        job = tool_content(await modern.call_tool("tpu_job_status", {"job_id": job["job_id"], "wait_s": 50}))
    assert job["state"] == "succeeded", job["log_tail"]
    assert job["command"][job["command"].index("--compiler") + 1] == "xla"
    assert "compiler xla 3.6372" in job["log_tail"]  # 4 * sin(2), computed by the XLA executable
    error = tool_error(await modern.call_tool("tpu_run", {"entrypoint": "compiled.py", "compiler": "tvm"}))
    assert error["code"] == "invalid-argument" and "compiler" in error["message"]
    for tool, arguments in (("tpu_profile", {"entrypoint": "compiled.py"}), ("tpu_check", {"model": "llama"})):
        started = tool_content(await modern.call_tool(tool, {**arguments, "compiler": "eager", "wait_s": 0}))
        await modern.call_tool("tpu_job_cancel", {"job_id": started["job_id"]})
        assert started["command"][started["command"].index("--compiler") + 1] == "eager", tool


async def test_chip_takes_the_clis_spellings(modern: Client, example: Path) -> None:
    schema = {t.name: t for t in (await modern.list_tools()).tools}["tpu_run"].input_schema["properties"]["chip"]
    spelled = next(option for option in schema["anyOf"] if option.get("type") == "string")  # or null: the default
    assert "v5e-8" in schema["description"] and spelled["maxLength"] <= 16
    job = (
        await modern.call_tool("tpu_run", {"entrypoint": "train.py", "chip": " V5E-8 ", "wait_s": 0})
    ).structured_content
    await modern.call_tool("tpu_job_cancel", {"job_id": job["job_id"]})
    assert job["command"][job["command"].index("--chip") + 1] == "v5e-8"  # canonicalised by parse_target
    for bad in ("v9", "v5e-0", "v5e-99999", "tpu"):
        error = tool_error(await modern.call_tool("tpu_run", {"entrypoint": "train.py", "chip": bad}))
        assert error["code"] == "invalid-argument" and "chip" in error["message"] and "v5e-8" in error["message"]
    error = tool_error(await modern.call_tool("tpu_diagnose", {"chip": "v99"}))
    assert error["code"] == "invalid-argument"


# The migrate library canonicalises rule selections (upper-case, prefixes) and refuses unknown codes in plan();
# the MCP tools pass select/ignore through unchanged and report a refusal as invalid-argument.
async def test_rule_selection_is_canonicalised_or_refused_never_silently_empty(modern: Client) -> None:
    result = await modern.call_tool("tpu_scan", {"paths": ["train.py"], "select": ["tpu1"]})
    if result.is_error:
        assert tool_error(result)["code"] == "invalid-argument"
    else:
        rules = {f["rule"] for f in result.structured_content["findings"]}
        assert rules and all(rule.startswith("TPU1") for rule in rules)
    for bad in (["TPU999"], ["nonsense"]):
        for tool in ("tpu_scan", "tpu_plan_migration"):
            error = tool_error(await modern.call_tool(tool, {"paths": ["train.py"], "select": bad}))
            assert error["code"] == "invalid-argument" and "select" in error["message"]
    error = tool_error(await modern.call_tool("tpu_plan_migration", {"paths": ["train.py"], "ignore": ["XYZ"]}))
    assert error["code"] == "invalid-argument"
