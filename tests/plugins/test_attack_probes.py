"""Attack probes against the MCP server, replayed through real MCP clients (in process, and over stdio where
the original failure was a crash or an escape): workspace escapes, a symlinked state directory, crafted
diagnose inputs, oversized and unknown arguments, job floods, and a server killed with jobs running.

Every probe runs in an arena: the workspace beside an ``outside`` directory of sentinel files (and
symlink targets); the arena outside the workspace is snapshotted before and compared after, so a probe
fails if anything at all was written, changed or deleted outside the workspace.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_helpers import tool_error

from tpu_agent.plugins.server import build_server

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cuda_ddp"
CUDA_SOURCE = "import torch\nx = torch.zeros(4).cuda()\ntorch.cuda.synchronize()\n"
SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n"


def _snapshot(root: Path, skip: Path) -> dict[str, str]:
    """Every entry under ``root`` except ``skip``: files by content hash, links by target, dirs by name."""
    seen: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        if here == skip or skip in here.parents:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            path = here / name
            if path == skip:
                continue
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                seen[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                seen[rel] = "dir"
            else:
                seen[rel] = "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


class Arena:
    """A workspace and, beside it, sentinels that no probe may touch."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.ws = base / "ws"
        shutil.copytree(EXAMPLE, self.ws)
        self.outside = base / "outside"
        (self.outside / "state").mkdir(parents=True)
        (self.outside / "secret.py").write_text(CUDA_SOURCE)
        (self.outside / "notes.txt").write_text("do not touch\n")
        (self.ws / "sleeper.py").write_text(SLEEPER)
        os.symlink(self.outside, self.ws / "escape-link")
        os.symlink(self.outside / "secret.py", self.ws / "linked_secret.py")
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, str]:
        return _snapshot(self.base, self.ws)

    def assert_untouched(self) -> None:
        assert self.snapshot() == self.before, "something outside the workspace changed"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def arena(tmp_path: Path) -> Arena:
    return Arena(tmp_path)


@pytest.fixture
async def client(arena: Arena) -> AsyncIterator[Client]:
    async with Client(build_server(str(arena.ws), max_jobs=2, max_ranks=2)) as c:
        yield c
    arena.assert_untouched()


async def _refused(client: Client, tool: str, args: dict[str, Any], *codes: str) -> dict[str, str]:
    error = tool_error(await client.call_tool(tool, args))
    assert error["code"] in codes, (tool, args, error)
    assert error["hint"], error
    return error


async def test_per_call_workspace_cannot_leave_the_started_one(client: Client, arena: Arena) -> None:
    calls = [
        ("tpu_scan", {}),
        ("tpu_plan_migration", {}),
        ("tpu_apply_plan", {"plan_id": "plan-000000000000"}),
        ("tpu_run", {"entrypoint": "secret.py", "wait_s": 0}),
        ("tpu_profile", {"entrypoint": "secret.py", "wait_s": 0}),
        ("tpu_diagnose", {}),
    ]
    for escape in (str(arena.outside), "/etc", str(arena.ws / ".."), str(arena.ws / "escape-link"), str(arena.base)):
        for tool, args in calls:
            await _refused(client, tool, {**args, "workspace": escape}, "workspace-outside-root")
        doctor = await client.call_tool("tpu_doctor", {"workspace": escape})
        assert not doctor.is_error  # the doctor reports, never fails
        assert "workspace-outside-root" in [p["code"] for p in doctor.structured_content["problems"]]
    (arena.ws / "pkg").mkdir()
    (arena.ws / "pkg" / "m.py").write_text(CUDA_SOURCE)
    inner = await client.call_tool("tpu_scan", {"workspace": str(arena.ws / "pkg")})  # narrowing is allowed
    assert not inner.is_error and inner.structured_content["findings"]


async def test_client_roots_bound_a_server_started_without_a_workspace(arena: Arena) -> None:
    """Hosts that load the server from a plugin cache give no --workspace, only MCP roots: those are then the
    boundary, and a workspace argument outside them is refused like one outside --workspace."""
    from mcp.types import ListRootsResult, Root

    async def roots(context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=arena.ws.resolve().as_uri(), name="project")])

    (arena.ws / "pkg").mkdir()
    async with Client(build_server(None), mode="legacy", list_roots_callback=roots) as client:
        for escape in ("/etc", str(arena.outside), str(arena.ws / ".."), str(arena.ws / "escape-link")):
            await _refused(client, "tpu_scan", {"workspace": escape}, "workspace-outside-roots")
        await _refused(client, "tpu_plan_migration", {"workspace": "/etc"}, "workspace-outside-roots")  # any tool
        inner = await client.call_tool("tpu_scan", {"workspace": str(arena.ws / "pkg")})
        assert not inner.is_error, inner.content[0].text
    arena.assert_untouched()


async def test_paths_cannot_escape(client: Client, arena: Arena) -> None:
    for paths in (["../outside/secret.py"], [str(arena.outside / "secret.py")], ["linked_secret.py"],
                  ["escape-link/secret.py"], ["escape-link"], ["/etc/passwd"], [".", "../outside"]):  # fmt: skip
        for tool in ("tpu_scan", "tpu_plan_migration"):
            await _refused(client, tool, {"paths": paths}, "path-outside-workspace")
    for entrypoint in ("../outside/secret.py", "linked_secret.py", "escape-link/secret.py", "/bin/true"):
        await _refused(client, "tpu_run", {"entrypoint": entrypoint, "wait_s": 0}, "path-outside-workspace")
    # The whole tree, links out included: planning and applying rewrites only files inside.
    plan = (await client.call_tool("tpu_plan_migration", {"paths": ["."]})).structured_content
    assert all(not c["path"].startswith(("/", "..", "escape-link", "linked_secret")) for c in plan["files_changed"])
    applied = await client.call_tool("tpu_apply_plan", {"plan_id": plan["plan_id"], "allow_dirty": True})
    assert not applied.is_error and applied.structured_content["files_written"]


async def test_a_symlinked_state_dir_is_refused(client: Client, arena: Arena) -> None:
    os.symlink(arena.outside / "state", arena.ws / ".tpu-agent")
    for tool, args in (
        ("tpu_plan_migration", {"paths": ["train.py"]}),
        ("tpu_run", {"entrypoint": "sleeper.py", "wait_s": 0}),
        ("tpu_profile", {"entrypoint": "sleeper.py", "wait_s": 0}),
        ("tpu_diagnose", {}),
        ("tpu_apply_plan", {"plan_id": "plan-000000000000"}),
    ):
        error = await _refused(client, tool, args, "unsafe-state-dir")
        assert "symlink" in error["message"] and ".tpu-agent" in error["hint"]
    assert list((arena.outside / "state").iterdir()) == []
    # Links planted below a real state dir: a plans/ link, then a plan file that points outside.
    (arena.ws / ".tpu-agent").unlink()
    (arena.ws / ".tpu-agent").mkdir()
    os.symlink(arena.outside / "state", arena.ws / ".tpu-agent" / "plans")
    await _refused(client, "tpu_plan_migration", {"paths": ["train.py"]}, "unsafe-state-dir")
    (arena.ws / ".tpu-agent" / "plans").unlink()
    plan_id = (await client.call_tool("tpu_plan_migration", {"paths": ["train.py"]})).structured_content["plan_id"]
    stored = arena.ws / ".tpu-agent" / "plans" / f"{plan_id}.json"
    stored.unlink()
    os.symlink(arena.outside / "notes.txt", stored)
    await _refused(client, "tpu_plan_migration", {"paths": ["train.py"]}, "unsafe-state-dir")
    await _refused(client, "tpu_apply_plan", {"plan_id": plan_id}, "unknown-plan")  # a link is not read as a plan
    os.symlink(arena.outside / "state", arena.ws / ".tpu-agent" / "jobs")
    await _refused(client, "tpu_run", {"entrypoint": "sleeper.py", "wait_s": 0}, "unsafe-state-dir")
    os.symlink(arena.outside, arena.ws / ".tpu-agent" / "profiles")
    await _refused(client, "tpu_diagnose", {}, "unsafe-state-dir")


async def test_diagnose_logdir_stays_below_the_workspace(client: Client, arena: Arena) -> None:
    (arena.ws / ".git").mkdir()
    (arena.ws / "caps").mkdir()
    os.symlink(arena.outside, arena.ws / "caps" / "out")
    for logdir, code in (
        (".", "logdir-is-workspace"),
        ("./", "logdir-is-workspace"),
        ("caps/..", "logdir-is-workspace"),
        ("..", "path-outside-workspace"),
        ("../..", "path-outside-workspace"),
        (str(arena.outside), "path-outside-workspace"),
        ("caps/out", "path-outside-workspace"),
        ("escape-link", "path-outside-workspace"),
        (".git", "path-in-git-dir"),
        ("train.py", "not-a-directory"),
        ("nope", "path-not-found"),
    ):
        await _refused(client, "tpu_diagnose", {"logdir": logdir}, code)


async def test_diagnose_of_a_capture_whose_files_name_paths_outside(client: Client, arena: Arena) -> None:
    """A capture's own options.json names its XProf session; a crafted one points far outside. Whatever the
    diagnosis says, nothing outside the workspace may be written or deleted (checked by the fixture)."""
    from tpu_agent.profile.synthetic import write_capture

    capture = arena.ws / "caps" / "crafted"
    raw = write_capture(capture, steps=12)
    options = json.loads((raw / "options.json").read_text())
    options["session"] = os.path.relpath(arena.outside / "state", capture / "plugins" / "profile")
    (raw / "options.json").write_text(json.dumps(options))
    (arena.outside / "state" / "a.trace.json.gz").write_text("cache-looking sentinel")  # what diagnose deletes
    arena.before = arena.snapshot()
    result = await client.call_tool("tpu_diagnose", {"logdir": "caps/crafted"})
    expected, after = arena.before, arena.snapshot()
    arena.before = after  # judged here, not again by the fixture
    if result.is_error:
        assert tool_error(result)["code"] != "internal-error"
    assert after == expected, "diagnose wrote or deleted outside the workspace"


async def test_diagnose_of_a_capture_with_planted_files(client: Client, arena: Arena) -> None:
    """Links planted at the names diagnose writes (a report, the session's XSpace): refused, nothing outside
    touched. (Records that would block or never end a read are probed over stdio, where a regression cannot
    hang the test run.)"""
    from tpu_agent.profile.synthetic import write_capture

    def plant_report(logdir: Path, raw: Path) -> None:
        os.symlink(arena.outside / "notes.txt", logdir / "tpu-agent" / "report.json")

    def plant_xspace(logdir: Path, raw: Path) -> None:
        session = logdir / "plugins" / "profile" / json.loads((raw / "options.json").read_text())["session"]
        session.mkdir(parents=True)
        for host in ("localhost", "synthetic", "host", socket.gethostname()):
            os.symlink(arena.outside / "notes.txt", session / f"{host}.xplane.pb")

    for index, plant in enumerate((plant_report, plant_xspace)):
        logdir = arena.ws / "caps" / f"planted{index}"
        plant(logdir, write_capture(logdir, steps=6))
        error = await _refused(client, "tpu_diagnose", {"logdir": f"caps/planted{index}"},
                               "path-outside-logdir", "damaged-capture")  # fmt: skip
        assert f"planted{index}" in error["message"], error


OVERSIZED = "x" * 100_000


async def test_oversized_input_is_an_invalid_argument(client: Client) -> None:
    for tool, args in (
        ("tpu_scan", {"paths": [OVERSIZED]}),
        ("tpu_scan", {"paths": ["a.py"] * 10_000}),
        ("tpu_scan", {"workspace": "/" + OVERSIZED}),
        ("tpu_scan", {"select": ["TPU" + OVERSIZED]}),
        ("tpu_plan_migration", {"ignore": ["TPU1"] * 10_000}),
        ("tpu_apply_plan", {"plan_id": "plan-" + OVERSIZED}),
        ("tpu_run", {"entrypoint": OVERSIZED}),
        ("tpu_run", {"entrypoint": "sleeper.py", "args": [OVERSIZED]}),
        ("tpu_run", {"entrypoint": "sleeper.py", "args": ["-v"] * 10_000}),
        ("tpu_run", {"entrypoint": "sleeper.py", "chip": OVERSIZED}),
        ("tpu_run", {"entrypoint": "sleeper.py", "nproc": 10**9}),
        ("tpu_profile", {"entrypoint": "sleeper.py", "steps": 10**12}),
        ("tpu_job_status", {"job_id": "run-" + OVERSIZED}),
        ("tpu_job_cancel", {"job_id": OVERSIZED}),
        ("tpu_diagnose", {"logdir": OVERSIZED}),
        ("tpu_diagnose", {"job_id": OVERSIZED}),
        ("tpu_explain_rule", {"code": OVERSIZED}),
        ("tpu_lookup_api", {"query": OVERSIZED}),
        ("tpu_doctor", {"workspace": "/" + OVERSIZED}),
    ):
        result = await client.call_tool(tool, args)
        error = tool_error(result)
        assert error["code"] == "invalid-argument", (tool, error)
        assert len(result.content[0].text) < 3000 and "x" * 200 not in result.content[0].text, tool
    # Inside the declared limits, still no internal error: a 4,000-character path, a 300-byte file name.
    for paths in (["a/" * 2000], ["d/" + "y" * 300]):
        error = await _refused(client, "tpu_scan", {"paths": paths}, "path-not-found")
        assert len(error["message"]) < 600


async def test_unknown_arguments_are_refused(client: Client) -> None:
    required = {"tpu_apply_plan": {"plan_id": "plan-000000000000"}, "tpu_run": {"entrypoint": "sleeper.py"},
                "tpu_profile": {"entrypoint": "sleeper.py"}, "tpu_job_status": {"job_id": "run-00000000"},
                "tpu_job_cancel": {"job_id": "run-00000000"}, "tpu_explain_rule": {"code": "TPU101"},
                "tpu_lookup_api": {"query": "nccl"}, "tpu_check": {"model": "llama"}}  # fmt: skip
    tools = {t.name: t for t in (await client.list_tools()).tools}
    for name, tool in tools.items():
        assert tool.input_schema.get("additionalProperties") is False, name
        error = await _refused(client, name, {**required.get(name, {}), "bogus_argument": 1}, "invalid-argument")
        assert "bogus_argument" in error["message"]
    # The case: a typo in `paths` must not scan the whole workspace on the defaults.
    error = await _refused(client, "tpu_scan", {"path": ["train.py"]}, "invalid-argument")
    assert "path" in error["message"]


@pytest.mark.slow
async def test_job_floods_are_bounded(client: Client, arena: Arena) -> None:
    doctor = (await client.call_tool("tpu_doctor", {})).structured_content
    assert doctor["limits"] == {"max_jobs": 2, "max_ranks": 2}  # an agent can see the bounds before it hits them
    results = await asyncio.gather(
        *(client.call_tool("tpu_run", {"entrypoint": "sleeper.py", "wait_s": 0}) for _ in range(8))
    )
    started = [r.structured_content["job_id"] for r in results if not r.is_error]
    refused = [tool_error(r) for r in results if r.is_error]
    assert len(started) == 2 and len(refused) == 6  # max_jobs=2, however many arrive at once
    for error in refused:
        assert error["code"] == "busy" and all(job_id in error["message"] for job_id in started)
    await _refused(client, "tpu_profile", {"entrypoint": "sleeper.py", "wait_s": 0}, "busy")
    assert not any((arena.ws / ".tpu-agent" / "profiles").iterdir())  # a refused profile leaves no capture dir
    await _refused(client, "tpu_run", {"entrypoint": "sleeper.py", "nproc": 3, "wait_s": 0}, "too-many-ranks")
    await client.call_tool("tpu_job_cancel", {"job_id": started[0]})
    again = await client.call_tool("tpu_run", {"entrypoint": "sleeper.py", "wait_s": 0})
    assert not again.is_error, again.content[0].text
    for job_id in (started[1], again.structured_content["job_id"]):
        await client.call_tool("tpu_job_cancel", {"job_id": job_id})


def _env(**extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(REPO),
        **extra,
    }


def _processes_in(directory: Path) -> set[int]:
    """Live processes whose working directory is ``directory`` (a job's, and whatever it started)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (
                    os.readlink(entry / "cwd") == str(directory.resolve())
                    and (entry / "stat").read_text().split()[2] != "Z"
                ):
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


def _wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _rpc(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> dict[str, Any] | None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()
    if "id" not in message:
        return None
    while True:
        line = proc.stdout.readline()
        assert line, "the server closed stdout"
        answer = json.loads(line)
        if answer.get("id") == message["id"]:
            return answer


def _start_stdio_server(arena: Arena) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_agent", "mcp", "--workspace", str(arena.ws)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(), cwd=arena.base,
    )  # fmt: skip
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}
    assert _rpc(proc, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
    _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    return proc


@pytest.mark.slow
def test_stdio_server_survives_hostile_messages(arena: Arena) -> None:
    proc = _start_stdio_server(arena)
    try:
        nested = "[" * 50_000 + '"x"' + "]" * 50_000  # deeper than any JSON parser recurses
        probes = [
            '{"name": "tpu_scan", "arguments": {"paths": ' + nested + "}}",
            json.dumps({"name": "tpu_scan", "arguments": {"paths": ["x" * 5_000_000]}}),
            json.dumps({"name": "tpu_scan", "arguments": {"workspace": "/etc"}}),
            json.dumps({"name": "tpu_scan", "arguments": {"paths": ["../../../../etc"]}}),
            json.dumps({"name": "tpu_scan", "arguments": {OVERSIZED: 1}}),
            json.dumps({"name": "tpu_diagnose", "arguments": {"logdir": "."}}),
            json.dumps({"name": "no_such_tool", "arguments": {}}),
        ]
        for index, params in enumerate(probes, start=1):
            message = f'{{"jsonrpc": "2.0", "id": {index}, "method": "tools/call", "params": {params}}}\n'
            proc.stdin.write(message.encode())  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        answered: dict[Any, dict[str, Any]] = {}
        deadline = time.monotonic() + 60
        while not set(range(2, len(probes) + 1)) <= set(answered) and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                assert line, f"the server died after answering {sorted(answered, key=str)}"
                message = json.loads(line)
                answered[message.get("id")] = message
        assert set(range(2, len(probes) + 1)) <= set(answered), sorted(answered, key=str)
        for index, message in answered.items():  # the nested one is a parse error (id 1 or null) or an error
            result = message.get("result")
            assert result is None or result.get("isError"), (index, message)
            assert "internal-error" not in json.dumps(message)[:10_000], index
        _assert_still_serving(proc, 99)
    finally:
        proc.kill()
        proc.wait()
    arena.assert_untouched()


def _assert_still_serving(proc: subprocess.Popen[bytes], request_id: int) -> None:
    """The stdio server answers a plain tool call after what came before it."""
    alive = _rpc(proc, {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                        "params": {"name": "tpu_lookup_api", "arguments": {"query": "nccl"}}})  # fmt: skip
    assert alive and alive["result"]["isError"] is False


@pytest.mark.slow
def test_stdio_scan_of_crafted_files_skips_them_and_lives(arena: Arena) -> None:
    """A file nested deeper than any parser recurses and a FIFO named like a source (a read would block
    forever) are skipped with a reason; a capture whose trace record is a FIFO is damage, not a hang; the
    server answers the next call."""
    from tpu_agent.profile.layout import TRACE_FILE
    from tpu_agent.profile.synthetic import write_capture

    (arena.ws / "deep.py").write_text(
        "import torch\nx = " + "(" * 5_000 + "torch.cuda.synchronize()" + ")" * 5_000 + "\n"
    )
    os.mkfifo(arena.ws / "x.py")
    trace = write_capture(arena.ws / "caps" / "fifo", steps=6) / TRACE_FILE.format(rank=0)
    trace.unlink()
    os.mkfifo(trace)
    proc = _start_stdio_server(arena)
    try:
        call = {"name": "tpu_scan", "arguments": {"paths": ["deep.py", "x.py", "train.py"]}}
        answer = _rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call})
        assert answer and answer["result"]["isError"] is False, answer
        skipped = answer["result"]["structuredContent"]["skipped"]
        assert any(entry.startswith("deep.py: ") for entry in skipped), skipped
        assert any(entry.startswith("x.py: ") for entry in skipped), skipped
        call = {"name": "tpu_diagnose", "arguments": {"logdir": "caps/fifo"}}
        answer = _rpc(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        assert answer and answer["result"]["isError"] is True, answer
        assert "damaged-capture" in answer["result"]["content"][0]["text"] and trace.name in str(answer)
        _assert_still_serving(proc, 3)
    finally:
        proc.kill()
        proc.wait()
    arena.assert_untouched()


async def test_mcp_apply_removes_stale_temp_files_but_nothing_planted_as_a_link(client: Client, arena: Arena) -> None:
    """A killed run leaves ".<name>.<random>.tpu-agent-tmp" files; the stored plan keeps them so the MCP apply
    cleans them as the CLI does. A link named like one (pointing outside) is not a stale temp file."""
    from tpu_agent.fsutil import TEMP_PREFIX, TEMP_SUFFIX

    stale = arena.ws / f"{TEMP_PREFIX}train.py.ab12cd34{TEMP_SUFFIX}"
    stale.write_text("half-written")
    os.utime(stale, (time.time() - 3_600, time.time() - 3_600))
    planted = arena.ws / f"{TEMP_PREFIX}notes.txt.zz99yy88{TEMP_SUFFIX}"
    os.symlink(arena.outside / "notes.txt", planted)
    os.utime(planted, (time.time() - 3_600, time.time() - 3_600), follow_symlinks=False)
    plan = await client.call_tool("tpu_plan_migration", {"paths": ["."]})
    assert not plan.is_error, plan
    applied = await client.call_tool(
        "tpu_apply_plan", {"plan_id": plan.structured_content["plan_id"], "allow_dirty": True}
    )
    assert not applied.is_error, applied
    assert not stale.exists()
    assert planted.is_symlink() and (arena.outside / "notes.txt").read_text() == "do not touch\n"


SPAWNER = """\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("grandchild", child.pid, "INJECTED", os.environ.get("INJECTED"), flush=True)
time.sleep(120)
"""
#: A script named like an option: its name was once parsed as `tpu-agent run --env INJECTED=1.py`, which set a
#: variable in every rank (and could name --rdzv-endpoint and the like) instead of running the script.
SPAWNER_NAME = "--env=INJECTED=1.py"


@pytest.mark.slow
def test_jobs_die_with_a_killed_server(arena: Arena) -> None:
    """SIGKILL gives the server no chance to clean up: the job guard's lifeline does it."""
    (arena.ws / SPAWNER_NAME).write_text(SPAWNER)
    proc = _start_stdio_server(arena)
    try:
        call = {"name": "tpu_run", "arguments": {"entrypoint": SPAWNER_NAME, "wait_s": 0, "backend": "emulated"}}
        job = _rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call})
        assert job and job["result"]["structuredContent"]["state"] == "running", job
        job_id = job["result"]["structuredContent"]["job_id"]
        log = arena.ws / ".tpu-agent" / "jobs" / job_id / "output.log"
        # the whole line: the job's output is relayed into the log and can arrive in pieces
        assert _wait_until(lambda: log.exists() and "\n" in log.read_text().partition("grandchild")[2], 60), (
            log.read_text()
        )
        assert "INJECTED None\n" in log.read_text()  # the script ran as the script
        processes = _processes_in(arena.ws)
        assert len(processes) >= 3  # guard, tpu-agent run (and its rank), the grandchild
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _wait_until(lambda: not (_processes_in(arena.ws) & processes), 10), "jobs outlived the killed server"
    arena.assert_untouched()
