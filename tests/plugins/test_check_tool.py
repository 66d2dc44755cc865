"""``tpu_check`` through the SDK's real MCP client: its closed schema, the workspace boundary for every MODEL form,
and one real check job on a tiny workspace factory (a device-only bug, so the report has something to find)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_helpers import tool_error

from tpu_agent.plugins.server import build_server

pytestmark = pytest.mark.anyio

# A factory as a user writes one: a small MLP whose middle layer computes differently on the tpu device only
# (as a device kernel bug would), so the check must report a mismatch and localise it to that layer.
FACTORY = """\
import torch
from torch import nn


class DeviceOnlyScale(nn.Module):
    def forward(self, x):
        y = torch.tanh(x)
        return y * 1.01 if y.device.type == "tpu" else y


def make_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), DeviceOnlyScale(), nn.Linear(16, 4))
    return model, torch.randn(2, 8)
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "models" / "pkg").mkdir(parents=True)
    (root / "models" / "tiny.py").write_text(FACTORY)
    (root / "models" / "pkg" / "__init__.py").write_text("")
    (root / "models" / "pkg" / "factory.py").write_text(FACTORY)
    outside = tmp_path / "outside"
    (outside / "model").mkdir(parents=True)
    (outside / "model" / "config.json").write_text('{"model_type": "bert"}')
    (outside / "evil.py").write_text(FACTORY)
    return root


@pytest.fixture
async def client(workspace: Path) -> AsyncIterator[Client]:
    async with Client(build_server(str(workspace)), mode="auto") as c:
        yield c


async def _refused(client: Client, args: dict[str, Any], code: str) -> dict[str, str]:
    error = tool_error(await client.call_tool("tpu_check", {"wait_s": 0, **args}))
    assert error["code"] == code, error
    assert error["hint"], error
    return error


async def test_schema_is_closed_and_bounded(client: Client) -> None:
    tool = {t.name: t for t in (await client.list_tools()).tools}["tpu_check"]
    schema = tool.input_schema
    assert schema["additionalProperties"] is False and schema["required"] == ["model"]
    properties = schema["properties"]
    assert properties["model"]["maxLength"] <= 4096 and properties["wait_s"]["maximum"] <= 50
    modes = json.dumps(properties["modes"])
    assert all(mode in modes for mode in ("strict", "defer-and-fuse", "compile")) and '"maxItems": 3' in modes
    assert "masked-lm" in json.dumps(properties["task"])
    assert tool.annotations.open_world_hint is False and tool.annotations.read_only_hint is False
    assert "check_path" in tool.output_schema["properties"]
    await _refused(client, {"model": "llama", "modes": ["eager"]}, "invalid-argument")
    await _refused(client, {"model": "llama", "mode": ["strict"]}, "invalid-argument")  # misspelt argument
    await _refused(client, {"model": "x" * 5000}, "invalid-argument")


REFUSED_MODELS = [
    ("../outside/model", "path-outside-workspace"),  # a model directory outside
    ("../outside/evil.py:make_model", "path-outside-workspace"),  # a factory file outside
    ("os:abort", "bad-model"),  # a module that is not in the workspace
    ("json:make_model", "bad-model"),  # a workspace file shadowing an importable module
    ("models/missing.py:make_model", "path-not-found"),
    ("models/tiny.py:make-model", "bad-factory"),  # not a function name
    ("-rf", "bad-model"),  # would read as an option
    ("llama;rm -rf", "bad-model"),
    ("models/tiny.py", "bad-model"),  # a file, not a directory
    ("bad\x00name", "bad-model"),
]


async def test_models_outside_the_workspace_links_out_or_malformed_are_refused(client: Client, workspace: Path) -> None:
    (workspace / "json.py").write_text(FACTORY)  # shadows the standard library's json
    for model, code in REFUSED_MODELS:
        await _refused(client, {"model": model}, code)
    outside = workspace.parent / "outside"
    os.symlink(outside / "model", workspace / "linked-model")
    await _refused(client, {"model": "linked-model"}, "path-outside-workspace")
    (workspace / "inner").mkdir()
    os.symlink(outside / "model" / "config.json", workspace / "inner" / "config.json")
    await _refused(client, {"model": "inner"}, "path-outside-workspace")
    os.symlink(outside / "evil.py", workspace / "models" / "linked.py")
    await _refused(client, {"model": "models/linked.py:make_model"}, "path-outside-workspace")
    await _refused(client, {"model": "models/tiny.py:make_model", "task": "causal-lm"}, "task-with-factory")
    assert not (workspace / ".tpu-agent" / "checks").exists()  # nothing refused started a job


@pytest.mark.slow  # a real check job: worker processes importing torch
async def test_check_job_reports_and_localises_a_device_only_bug(client: Client, workspace: Path) -> None:
    job = (
        await client.call_tool(
            "tpu_check", {"model": "models.pkg.factory:make_model", "modes": ["strict"], "wait_s": 50}
        )
    ).structured_content
    for _ in range(12):
        if job["state"] != "running":
            break
        job = (await client.call_tool("tpu_job_status", {"job_id": job["job_id"], "wait_s": 50})).structured_content
    assert job["kind"] == "check" and job["job_id"].startswith("check-")
    command = job["command"]
    assert command[3] == "check" and command[-2:] == ["--", "models.pkg.factory:make_model"]
    # exit code 1 (a mode failed) with the report written is an answer, not a failed job
    assert job["state"] == "succeeded" and job["exit_code"] == 1, job["log_tail"]
    assert job["check_path"].startswith(".tpu-agent/checks/") and job["check_path"] in job["next_action"]
    report = json.loads((workspace / job["check_path"]).read_text())
    assert report["status"] == "mismatch" and [m["mode"] for m in report["modes"]] == ["strict"]
    where = report["modes"][0]["localisation"]
    assert where["module"] == "1" and where["module_type"] == "DeviceOnlyScale" and where["op"].startswith("aten::mul")
    # an unknown model type is refused before any job starts, with close names suggested
    error = await _refused(client, {"model": "lamma"}, "unknown-model")
    assert "llama" in error["hint"]
    assert len(list((workspace / ".tpu-agent" / "checks").iterdir())) == 1
