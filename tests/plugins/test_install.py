"""The harness config installer on a temporary HOME: merges, keeps other servers and comments, idempotent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from tpu_agent.errors import TpuAgentError
from tpu_agent.plugins.install import HARNESSES, install, print_config

REPO = Path(__file__).resolve().parents[2]

COMMAND = ["/opt/bin/tpu-agent"]
OTHER = {"command": "other-server", "args": ["--flag"]}


def _servers(path: Path, key: str) -> dict:
    text = path.read_text()
    data = tomlkit.parse(text).unwrap() if path.suffix == ".toml" else json.loads(text)
    return data[key]


def _scopes(name: str) -> list[str]:
    return ["user"] if HARNESSES[name].project_file is None else ["project", "user"]


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_fresh_install_then_rerun_is_a_noop(name: str, tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "proj"
    home.mkdir()
    project.mkdir()
    for scope in _scopes(name):
        first = install(name, scope, project=project, home=home, command=COMMAND)  # type: ignore[arg-type]
        assert first.changed and first.written
        entry = _servers(first.path, HARNESSES[name].key)["tpu-agent"]
        assert entry["command"] == COMMAND[0] and entry["args"][0] == "mcp"
        assert first.path.is_relative_to(project if scope == "project" else home)
        before = first.path.read_bytes()
        second = install(name, scope, project=project, home=home, command=COMMAND)  # type: ignore[arg-type]
        assert not second.changed and not second.written and second.diff == ""
        assert first.path.read_bytes() == before


@pytest.mark.parametrize("name", sorted(n for n in HARNESSES if HARNESSES[n].format == "json"))
def test_json_merge_keeps_other_servers_and_settings(name: str, tmp_path: Path) -> None:
    harness = HARNESSES[name]
    scope = _scopes(name)[-1]
    path = install(name, scope, project=tmp_path, home=tmp_path, dry_run=True, command=COMMAND).path  # type: ignore[arg-type]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"theme": "dark", harness.key: {"other": OTHER, "tpu-agent": {"command": "old"}}}, indent=2)
    )
    result = install(name, scope, project=tmp_path, home=tmp_path, command=COMMAND)  # type: ignore[arg-type]
    data = json.loads(path.read_text())
    assert data["theme"] == "dark"
    assert data[harness.key]["other"] == OTHER
    assert data[harness.key]["tpu-agent"] == result.entry
    removed = [line for line in result.diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert any('"old"' in line for line in removed)  # the stale entry is replaced, and the diff shows it
    assert not any("other-server" in line for line in removed)


def test_codex_toml_keeps_comments_and_other_servers(tmp_path: Path) -> None:
    path = tmp_path / ".codex" / "config.toml"
    path.parent.mkdir()
    original = (
        "# my codex settings\n"
        'model = "gpt-5"  # keep this comment\n\n'
        "[mcp_servers.other]\n"
        "# the other server\n"
        'command = "other-server"\n'
        'args = ["--flag"]\n'
    )
    path.write_text(original)
    dry = install("codex", "user", home=tmp_path, dry_run=True, command=COMMAND)
    assert path.read_text() == original  # --dry-run writes nothing
    assert "+[mcp_servers.tpu-agent]" in dry.diff
    install("codex", "user", home=tmp_path, command=COMMAND)
    text = path.read_text()
    assert text.startswith(original)  # every original byte, comments included, kept in place
    data = tomlkit.parse(text).unwrap()
    assert data["mcp_servers"]["other"] == OTHER
    assert data["mcp_servers"]["tpu-agent"] == {"command": COMMAND[0], "args": ["mcp"]}
    assert not install("codex", "user", home=tmp_path, command=COMMAND).changed


def test_jsonc_is_refused_with_the_snippet(tmp_path: Path) -> None:
    path = tmp_path / ".vscode" / "mcp.json"
    path.parent.mkdir()
    text = '{\n  // my servers\n  "servers": {}\n}\n'
    path.write_text(text)
    with pytest.raises(TpuAgentError) as info:
        install("vscode", "project", project=tmp_path, command=COMMAND)
    assert info.value.code == "config-not-plain-json"
    assert '"tpu-agent"' in info.value.hint
    assert path.read_text() == text


def test_workspace_arguments_per_harness(tmp_path: Path) -> None:
    project = tmp_path.resolve()

    def args(name: str, scope: str) -> list[str]:
        return install(name, scope, project=project, home=tmp_path, dry_run=True, command=COMMAND).entry["args"]  # type: ignore[arg-type]

    assert args("claude-code", "project") == ["mcp"]  # Claude Code sets CLAUDE_PROJECT_DIR itself
    assert args("vscode", "project") == ["mcp", "--workspace", "${workspaceFolder}"]
    assert args("cursor", "user") == ["mcp", "--workspace", "${workspaceFolder}"]
    assert args("codex", "project") == ["mcp", "--workspace", str(project)]
    assert args("codex", "user") == ["mcp"]
    assert HARNESSES["zed"].extra == (("source", "custom"),)
    assert install("zed", "user", home=tmp_path, dry_run=True, command=COMMAND).entry["source"] == "custom"
    with pytest.raises(TpuAgentError) as info:
        install("windsurf", "project", project=project, command=COMMAND)
    assert info.value.code == "no-project-scope"


def test_print_config_is_what_install_writes(tmp_path: Path) -> None:
    for name in HARNESSES:
        scope = _scopes(name)[0]
        path, content = print_config(name, scope, project=tmp_path, home=tmp_path / "h", command=COMMAND)  # type: ignore[arg-type]
        result = install(name, scope, project=tmp_path, home=tmp_path / "h", command=COMMAND)  # type: ignore[arg-type]
        assert result.path == path and path.read_text() == content


def _cli(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tpu_agent", "plugin", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


@pytest.mark.slow
def test_cli_install_json_and_dry_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    dry = _cli(
        "install", "--harness", "gemini", "--scope", "user", "--dry-run", "--format", "json", home=home, cwd=tmp_path
    )
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dry_run"] and report["changed"] and not report["written"] and "+" in report["diff"]
    assert not (home / ".gemini" / "settings.json").exists()
    done = _cli("install", "--harness", "gemini", "--scope", "user", "--format", "json", home=home, cwd=tmp_path)
    assert json.loads(done.stdout)["written"]
    assert "tpu-agent" in json.loads((home / ".gemini" / "settings.json").read_text())["mcpServers"]
    bad = _cli("install", "--harness", "windsurf", "--scope", "project", "--format", "json", home=home, cwd=tmp_path)
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["code"] == "no-project-scope"
    printed = _cli("print-config", "--harness", "zed", "--format", "json", home=home, cwd=tmp_path)
    assert json.loads(json.loads(printed.stdout)["content"])["context_servers"]["tpu-agent"]["source"] == "custom"
