"""The server as hosts start it: a subprocess speaking JSON-RPC on stdio (and HTTP on loopback)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tpu_agent.plugins.server import TOOL_MODULES

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # each test starts a server process

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(REPO),
        **extra,
    }


class RawServer:
    """``tpu-agent mcp`` driven by hand, so every byte it writes to stdout can be checked."""

    def __init__(self, workspace: Path) -> None:
        self.stderr = (workspace.parent / "server.stderr").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tpu_agent", "mcp", "--workspace", str(workspace)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=_env(),
            cwd="/",
        )
        self.lines: list[bytes] = []
        self.next_id = 0

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = self.proc.stdout.readline()
            assert line, "server closed stdout"
            self.lines.append(line)
            message = json.loads(line)
            if message.get("id") == self.next_id:
                return message
        raise AssertionError(f"no answer to {method} within {timeout} s")

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.request("tools/call", {"name": name, "arguments": arguments})["result"]


def _pids_in(workspace: Path) -> set[int]:
    """Live processes whose cwd is the workspace (the jobs the server started)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == str(workspace.resolve()):
                    state = (entry / "stat").read_text().split()[2]
                    if state != "Z":
                        pids.add(int(entry.name))
            except OSError:
                continue
    return pids


def test_stdout_is_only_protocol_and_exit_kills_jobs(example: Path) -> None:
    server = RawServer(example)
    try:
        init = server.request(
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
        )
        assert init["result"]["serverInfo"]["name"] == "tpu-agent"
        server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools = server.request("tools/list", {})["result"]["tools"]
        assert {tool["name"] for tool in tools} == {spec.name for module in TOOL_MODULES for spec in module.TOOLS}
        assert server.call("tpu_lookup_api", {"query": "nccl"})["isError"] is False
        bad = server.call("tpu_run", {"entrypoint": 7})
        assert bad["isError"] is True
        assert server.proc.stdin is not None
        server.proc.stdin.write(b"{this is not json\n")  # a broken host message
        server.proc.stdin.flush()
        assert server.call("tpu_lookup_api", {"query": "empty_cache"})["isError"] is False  # still serving
        escape = server.call("tpu_scan", {"paths": ["../../.."]})
        assert escape["isError"] and "path-outside-workspace" in escape["content"][0]["text"]
        job = server.call("tpu_run", {"entrypoint": "train.py", "args": ["--steps", "100000"], "wait_s": 0})
        assert job["structuredContent"]["state"] == "running"
        deadline = time.monotonic() + 30
        while not _pids_in(example) and time.monotonic() < deadline:
            time.sleep(0.1)
        children = _pids_in(example)
        assert children
        assert server.proc.stdin is not None
        server.proc.stdin.close()  # the host goes away
        assert server.proc.wait(timeout=30) == 0
        rest = server.proc.stdout.read() if server.proc.stdout else b""
        server.lines.extend(rest.splitlines(keepends=True))
        deadline = time.monotonic() + 15
        while _pids_in(example) & children and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not (_pids_in(example) & children), "jobs outlived the server"
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.stderr.close()
    for line in server.lines:  # nothing but JSON-RPC on stdout
        assert json.loads(line)["jsonrpc"] == "2.0", line


async def test_sdk_client_over_stdio(example: Path, tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tpu_agent", "mcp", "--max-jobs", "1", "--max-ranks", "3"],
        cwd="/",
        env=_env(CLAUDE_PROJECT_DIR=str(example)),
    )
    errlog = (tmp_path / "stderr.txt").open("w")
    started = time.monotonic()
    async with Client(stdio_client(params, errlog=errlog)) as client:
        startup = time.monotonic() - started
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"tpu_scan", "tpu_plan_migration", "tpu_apply_plan", "tpu_run", "tpu_diagnose"} <= names
        doctor = (await client.call_tool("tpu_doctor", {})).structured_content
        assert doctor["workspace"] == str(example.resolve()) and doctor["workspace_source"] == "CLAUDE_PROJECT_DIR"
        assert doctor["limits"] == {"max_jobs": 1, "max_ranks": 3}  # the CLI's options reach the server
        escape = await client.call_tool("tpu_scan", {"workspace": str(example.parent)})
        assert escape.is_error and "workspace-outside-root" in escape.content[0].text  # the variable is a boundary
        bad = await client.call_tool("tpu_job_cancel", {"job_id": ["not", "a", "string"]})
        assert bad.is_error
        after = await client.call_tool("tpu_lookup_api", {"query": "cudnn.benchmark"})
        assert not after.is_error and after.structured_content["matches"]
    errlog.close()
    assert startup < 30


def _listen_addresses(port: int) -> set[str]:
    """Local addresses listening on ``port``, from /proc/net/tcp{,6} (state 0A = LISTEN)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hex_port, 16) == port:
                if len(address) == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(address)[::-1]))
                else:
                    found.add(address)
    return found


async def test_streamable_http_binds_loopback_only(example: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path / "http.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tpu_agent",
            "mcp",
            "--transport",
            "streamable-http",
            "--port",
            str(port),
            "--workspace",
            str(example),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("HTTP server did not start")
        assert _listen_addresses(port) == {"127.0.0.1"}
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            result = await client.call_tool("tpu_lookup_api", {"query": "CUDA_VISIBLE_DEVICES"})
            assert result.structured_content["matches"][0]["tpu"] == "TPU_VISIBLE_DEVICES"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()
