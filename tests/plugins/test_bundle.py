"""The plugin directory: generated from one source, committed in sync, and accepted by the hosts' validators."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tpu_agent.plugins.build import (
    AGENT_PLUGINS_MCP_SCHEMA,
    AGENT_PLUGINS_SCHEMA,
    check_bundle,
    render_bundle,
    write_bundle,
)
from tpu_agent.plugins.bundles import parse_markdown

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "plugin"
VENV_BIN = str(Path(sys.executable).parent)
NPM_CACHE = Path(os.environ.get("TPU_AGENT_TEST_NPM_DIR", Path.home() / ".cache" / "tpu-agent-tests" / "npm"))
HOST_CLIS = {
    "claude": "@anthropic-ai/claude-code@2.1.328",
    "gemini": "@google/gemini-cli@0.61.0",
    "codex": "@openai/codex@0.169.0",
    "copilot": "@github/copilot@1.0.102",
}
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpu_agent", "plugin", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def test_committed_plugin_matches_a_fresh_build() -> None:
    result = _cli("build", "--check", "--out", str(PLUGIN), "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["clean"], f"plugin/ is stale, run `tpu-agent plugin build`: {report}"


@pytest.mark.slow
def test_build_writes_fixes_and_prunes(tmp_path: Path) -> None:
    out = tmp_path / "plugin"
    first = write_bundle(out)
    assert sorted(first.missing) == sorted(render_bundle()) and check_bundle(out).clean
    (out / "plugin.json").write_text("{}")
    (out / "stale.txt").write_text("old")
    stale = _cli("build", "--check", "--out", str(out), "--format", "json")
    assert stale.returncode == 1
    assert json.loads(stale.stdout) == {
        "out": str(out),
        "check": True,
        "clean": False,
        "missing": [],
        "changed": ["plugin.json"],
        "extra": ["stale.txt"],
    }
    assert (out / "stale.txt").exists()  # --check writes nothing
    assert _cli("build", "--out", str(out)).returncode == 0
    assert check_bundle(out).clean and not (out / "stale.txt").exists()


def test_agent_plugins_1_0_rules() -> None:
    manifest = json.loads((PLUGIN / "plugin.json").read_text())
    allowed = {
        "$schema",
        "name",
        "version",
        "description",
        "author",
        "homepage",
        "repository",
        "license",
        "keywords",
        "extensions",
    }
    assert set(manifest) <= allowed
    assert manifest["$schema"] == AGENT_PLUGINS_SCHEMA
    assert NAME_RE.match(manifest["name"]) and "--" not in manifest["name"] and len(manifest["name"]) <= 64
    assert set(manifest["author"]) <= {"name", "email", "url"}
    mcp = json.loads((PLUGIN / "mcp.json").read_text())
    assert mcp["$schema"] == AGENT_PLUGINS_MCP_SCHEMA
    for entry in mcp["mcpServers"].values():
        assert set(entry) <= {"type", "command", "args", "env", "cwd"} and entry["type"] == "stdio"
        assert " " not in entry["command"] and "PLUGIN_ROOT" not in json.dumps(entry.get("env", {}))
    for path in PLUGIN.rglob("*"):
        assert not path.is_symlink() and path.resolve().is_relative_to(PLUGIN.resolve())


def test_every_manifest_registers_the_same_server() -> None:
    claude = json.loads((PLUGIN / ".mcp.json").read_text())["mcpServers"]
    portable = json.loads((PLUGIN / "mcp.json").read_text())["mcpServers"]
    gemini = json.loads((PLUGIN / "gemini-extension.json").read_text())
    assert set(claude) == set(portable) == set(gemini["mcpServers"]) == {"tpu-agent"}
    assert claude["tpu-agent"]["args"][0] == portable["tpu-agent"]["args"][0] == "mcp"
    assert gemini["mcpServers"]["tpu-agent"]["args"] == ["mcp", "--workspace", "${workspacePath}"]
    versions = {
        json.loads((PLUGIN / f).read_text())["version"]
        for f in (".claude-plugin/plugin.json", "plugin.json", "gemini-extension.json")
    }
    from tpu_agent import __version__

    assert versions == {__version__}
    assert (PLUGIN / gemini["contextFileName"]).is_file()


def test_skills_and_commands_are_well_formed() -> None:
    skills = sorted(p for p in (PLUGIN / "skills").iterdir() if p.is_dir())
    assert [p.name for p in skills] == ["tpu-migrate", "tpu-tune"]
    for skill in skills:
        doc = parse_markdown((skill / "SKILL.md").read_text(), str(skill))
        assert doc.frontmatter["name"] == skill.name
        assert set(doc.frontmatter) <= {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
        assert 0 < len(doc.frontmatter["description"]) <= 1024
    workflow = (PLUGIN / "skills" / "tpu-migrate" / "SKILL.md").read_text()
    for step in ("tpu_scan", "tpu_plan_migration", "approval", "tpu_apply_plan", "tpu_run", "tpu_job_status"):
        assert step in workflow
    tune = (PLUGIN / "skills" / "tpu-tune" / "SKILL.md").read_text()
    for step in ("tpu_profile", "tpu_diagnose", "suggested_change", "again"):
        assert step in tune
    for toml in (PLUGIN / "commands" / "tpu").glob("*.toml"):
        command = tomllib.loads(toml.read_text())
        assert "{{args}}" in command["prompt"] and command["description"]


def test_agentskills_reference_validator() -> None:
    validator = shutil.which("agentskills", path=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    if validator is None:
        pytest.skip("skills-ref (agentskills) is not installed: pip install skills-ref")
    for skill in sorted((PLUGIN / "skills").iterdir()):
        result = subprocess.run([validator, "validate", str(skill)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


_npm_failure: list[str] = []  # why the one npm install of this session failed, if it did


def _host_cli(name: str) -> str:
    """A host CLI from the npm test cache; the first miss installs every host there in one npm call.

    Skips (with the reason) when npm or a package cannot be had, so a machine without npm still runs the rest.
    """
    binary = NPM_CACHE / "node_modules" / ".bin" / name
    if binary.exists():
        return str(binary)
    if shutil.which("npm") is None:
        pytest.skip(f"npm is missing, so {HOST_CLIS[name]} cannot be installed to validate the plugin")
    if not _npm_failure:
        NPM_CACHE.mkdir(parents=True, exist_ok=True)
        command = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NPM_CACHE), *HOST_CLIS.values()]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=300)
            if result.returncode != 0:
                _npm_failure.append(result.stderr.strip()[-300:])
        except subprocess.TimeoutExpired:
            _npm_failure.append("npm install took over 300 s")
    if not binary.exists():
        pytest.skip(f"could not install {HOST_CLIS[name]} with npm: {_npm_failure[0] if _npm_failure else 'no binary'}")
    return str(binary)


def _host_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "HOME": str(home), "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""), "CI": "1"}


@pytest.mark.slow
def test_claude_code_validates_installs_and_connects(tmp_path: Path) -> None:
    claude = _host_cli("claude")
    env = _host_env(tmp_path)
    validate = subprocess.run(
        [claude, "plugin", "validate", "--strict", "--json", str(PLUGIN)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    report = json.loads(validate.stdout)
    assert validate.returncode == 0 and report["success"], validate.stdout
    assert report["provides"]["skills"] == ["tpu-agent:tpu-migrate", "tpu-agent:tpu-tune"]
    assert [s["name"] for s in report["provides"]["mcpServers"]] == ["tpu-agent"]
    market = tmp_path / "market"
    shutil.copytree(PLUGIN, market / "tpu-agent")
    (market / ".claude-plugin").mkdir()
    (market / ".claude-plugin" / "marketplace.json").write_text(
        json.dumps(
            {
                "name": "tpu-agent-test",
                "owner": {"name": "tests"},
                "plugins": [{"name": "tpu-agent", "source": "./tpu-agent"}],
            }
        )
    )
    project = tmp_path / "project"
    project.mkdir()
    for args in (["plugin", "marketplace", "add", str(market)], ["plugin", "install", "tpu-agent@tpu-agent-test"]):
        step = subprocess.run([claude, *args], capture_output=True, text=True, env=env, cwd=project, timeout=120)
        assert step.returncode == 0, step.stdout + step.stderr
    listed = subprocess.run([claude, "mcp", "list"], capture_output=True, text=True, env=env, cwd=project, timeout=120)
    line = next(row for row in listed.stdout.splitlines() if "plugin:tpu-agent:tpu-agent" in row)
    assert "Connected" in line, listed.stdout  # Claude Code really started `tpu-agent mcp` and handshook


@pytest.mark.slow
def test_gemini_cli_validates_links_and_connects(tmp_path: Path) -> None:
    gemini = _host_cli("gemini")
    env = _host_env(tmp_path)
    validate = subprocess.run(
        [gemini, "extensions", "validate", str(PLUGIN)], capture_output=True, text=True, env=env, timeout=120
    )
    assert validate.returncode == 0 and "successfully validated" in validate.stdout + validate.stderr
    project = tmp_path / "project"
    project.mkdir()
    link = subprocess.run(
        [gemini, "extensions", "link", str(PLUGIN), "--consent"],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=120,
    )
    assert link.returncode == 0, link.stdout + link.stderr
    listed = subprocess.run([gemini, "mcp", "list"], capture_output=True, text=True, env=env, cwd=project, timeout=120)
    out = listed.stdout + listed.stderr
    line = next(row for row in out.splitlines() if "tpu-agent (from tpu-agent)" in row)
    assert f"--workspace {project}" in line and "Connected" in line, out


@pytest.mark.slow
def test_copilot_cli_installs_the_agent_plugin(tmp_path: Path) -> None:
    copilot = _host_cli("copilot")
    env = _host_env(tmp_path)
    install = subprocess.run(
        [copilot, "plugin", "install", str(PLUGIN)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert install.returncode == 0 and "Installed 2 skills" in install.stdout, install.stdout + install.stderr
    listed = subprocess.run(
        [copilot, "mcp", "list"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert "tpu-agent (local)" in listed.stdout, listed.stdout + listed.stderr


@pytest.mark.slow
def test_codex_installs_the_agent_plugin_and_reads_the_installer_toml(tmp_path: Path) -> None:
    codex = _host_cli("codex")
    env = _host_env(tmp_path)
    market = tmp_path / "market"
    shutil.copytree(PLUGIN, market / "tpu-agent")
    (market / ".agents" / "plugins").mkdir(parents=True)
    (market / ".agents" / "plugins" / "marketplace.json").write_text(
        json.dumps(
            {
                "name": "tpu-agent-test",
                "plugins": [
                    {
                        "name": "tpu-agent",
                        "source": {"source": "local", "path": "./tpu-agent"},
                        "policy": {"installation": "AVAILABLE", "authentication": "ON_INSTALL"},
                        "category": "Developer Tools",
                    }
                ],
            }
        )
    )
    for args in (["plugin", "marketplace", "add", str(market)], ["plugin", "add", "tpu-agent@tpu-agent-test"]):
        step = subprocess.run([codex, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert step.returncode == 0, step.stdout + step.stderr
    listed = subprocess.run(
        [codex, "mcp", "list", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    servers = {s["name"]: s for s in json.loads(listed.stdout)}
    assert "tpu-agent" in servers, listed.stdout
    # The installer's TOML, with a comment and another server already there, is what Codex reads.
    config = Path(env["HOME"]) / ".codex" / "config.toml"
    config.write_text(
        config.read_text() + '\n# mine\n[mcp_servers.other]\ncommand = "other"\n'
        if config.exists()
        else '# mine\n[mcp_servers.other]\ncommand = "other"\n'
    )
    subprocess.run(
        [sys.executable, "-m", "tpu_agent", "plugin", "install", "--harness", "codex", "--scope", "user"],
        check=True,
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    listed = subprocess.run(
        [codex, "mcp", "list", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    names = [s["name"] for s in json.loads(listed.stdout)]
    assert "other" in names and "tpu-agent" in names, listed.stdout
    assert "# mine" in config.read_text()


@pytest.mark.slow
def test_gemini_cli_connects_to_the_installer_entry(tmp_path: Path) -> None:
    gemini = _host_cli("gemini")
    env = _host_env(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(
        [sys.executable, "-m", "tpu_agent", "plugin", "install", "--harness", "gemini"],
        check=True,
        capture_output=True,
        env=env,
        cwd=project,
        timeout=60,
    )
    # Gemini CLI starts project servers only in folders the user trusted.
    trust = Path(env["HOME"]) / ".gemini" / "trustedFolders.json"
    trust.parent.mkdir(parents=True, exist_ok=True)
    trust.write_text(json.dumps({str(project): "TRUST_FOLDER"}))
    listed = subprocess.run([gemini, "mcp", "list"], capture_output=True, text=True, env=env, cwd=project, timeout=120)
    out = listed.stdout + listed.stderr
    line = next(row for row in out.splitlines() if "tpu-agent" in row)
    assert "Connected" in line, out
