"""End to end: a real MCP client, configured exactly as `tpu-agent plugin print-config --harness claude-code`
says, migrates the bundled CUDA example, runs it, profiles it and reads the diagnosis, through the tools alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # migrates, runs and profiles through a real host config

REPO = Path(__file__).resolve().parents[2]


async def _finish(client: Client, job: dict[str, Any]) -> dict[str, Any]:
    """Poll tpu_job_status the way the skills tell agents to."""
    for _ in range(12):
        if job["state"] != "running":
            return job
        job = (await client.call_tool("tpu_job_status", {"job_id": job["job_id"], "wait_s": 30})).structured_content
    return job


async def _call(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    assert not result.is_error, f"{name}: {result.content[0].text}"
    return result.structured_content


@pytest.mark.long  # a migration, a two-rank run and a profile, each a job: about half a minute
async def test_claude_code_config_migrates_runs_profiles_and_diagnoses(example: Path) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(REPO)}
    printed = subprocess.run(
        [sys.executable, "-m", "tpu_agent", "plugin", "print-config", "--harness", "claude-code", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=example,
        env=env,
        timeout=60,
        check=True,
    )
    config = json.loads(printed.stdout)
    assert Path(config["path"]) == example.resolve() / ".mcp.json"
    entry = json.loads(config["content"])["mcpServers"]["tpu-agent"]
    assert entry["type"] == "stdio"
    # What Claude Code does with that entry: start it in the project with CLAUDE_PROJECT_DIR set.
    params = StdioServerParameters(
        command=entry["command"], args=entry["args"], cwd=str(example), env={**env, "CLAUDE_PROJECT_DIR": str(example)}
    )
    async with Client(params) as client:
        scan = await _call(client, "tpu_scan", {})
        assert scan["findings"]
        plan = await _call(client, "tpu_plan_migration", {"paths": ["."]})
        assert "train.py" in plan["file_hashes"]
        applied = await _call(client, "tpu_apply_plan", {"plan_id": plan["plan_id"]})
        assert "train.py" in applied["files_written"]

        run = await _finish(
            client,
            await _call(
                client, "tpu_run", {"entrypoint": "train.py", "args": ["--steps", "4"], "nproc": 2, "wait_s": 45}
            ),
        )
        assert run["state"] == "succeeded", "\n".join(run["log_tail"])
        assert sum(line.startswith("step 3 loss") for line in run["log_tail"]) >= 1

        profile = await _finish(
            client,
            await _call(
                client,
                "tpu_profile",
                # verify=False: the suite's setting for captures (tests/conftest.py); the checking of diffs is
                # tested in tests/profile/test_verify_profile.py, and here the switch reaches the profile
                {
                    "entrypoint": "train.py",
                    "args": ["--steps", "6"],
                    "steps": 4,
                    "warmup": 1,
                    "verify": False,
                    "wait_s": 45,
                },
            ),
        )
        assert profile["state"] == "succeeded", "\n".join(profile["log_tail"])
        assert profile["profile_dir"].startswith(".tpu-agent/profiles/") and any(
            (example / profile["profile_dir"]).iterdir()
        )

        diagnosis = await _call(client, "tpu_diagnose", {"job_id": profile["job_id"]})
        assert diagnosis["report"] and diagnosis["findings"]
        # The example prints loss.item() every step: a host sync the diagnosis must pin to its line.
        assert any(loc.startswith("train.py:") for f in diagnosis["findings"] for loc in f["locations"])
        for finding in diagnosis["findings"]:
            assert finding["rule"] and finding["suggested_change"], finding
        offered = [f for f in diagnosis["findings"] if f["agent_diff"]]
        assert offered  # the eager-mode and host-sync diffs, each marked unverified in words (advice is a promise)
        for finding in offered:
            assert not finding["diff_verified"], finding
            assert finding["verification"] == "Unverified diff: verification is off (--no-verify).", finding
        assert diagnosis["logdir"] == profile["profile_dir"]
