"""``tpu-agent plugin build``: render the one plugin directory every harness installs, from one source.

The canonical source is :mod:`tpu_agent.plugins.bundles` (``plugin.toml``, skills, commands, context,
README). From it this module renders, side by side in one directory:

* Claude Code: ``.claude-plugin/plugin.json`` + ``.mcp.json`` + ``commands/*.md`` + ``skills/``;
* Agent Plugins 1.0 (VS Code, Copilot, Codex, Cursor): ``plugin.json`` + ``mcp.json`` + ``skills/``;
* Gemini CLI: ``gemini-extension.json`` + ``GEMINI.md`` + ``commands/tpu/*.toml`` + ``skills/``.

Rendering is a pure function (:func:`render_bundle`), so ``--check`` compares the committed directory
with a fresh render byte for byte, and a test fails when someone edits one without the other.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from tpu_agent import __version__
from tpu_agent.fsutil import atomic_write_bytes
from tpu_agent.plugins.bundles import load_commands, load_metadata, load_skill, load_text, skill_names
from tpu_agent.plugins.install import GEMINI_ENTRY_FIELDS

AGENT_PLUGINS_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json"
AGENT_PLUGINS_MCP_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json"
#: Gemini CLI expands this in extension manifests to the project directory the CLI runs in.
GEMINI_WORKSPACE_VAR = "${workspacePath}"
#: Command prefix: Gemini's commands/tpu/migrate.toml is /tpu:migrate, Claude's commands/tpu-migrate.md
#: is /tpu-agent:tpu-migrate.
COMMAND_PREFIX = "tpu"


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _author(meta: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in meta["author"].items() if k in {"name", "email", "url"}}


def _stdio_entry(meta: dict[str, Any], *, typed: bool, extra_args: list[str] | None = None) -> dict[str, Any]:
    server = meta["server"]
    entry: dict[str, Any] = {"type": "stdio"} if typed else {}
    entry["command"] = server["command"]
    entry["args"] = [*server["args"], *(extra_args or [])]
    return entry


def _common_manifest(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": meta["name"],
        "version": __version__,
        "description": meta["description"],
        "author": _author(meta),
        "homepage": meta["homepage"],
        "repository": meta["repository"],
        "license": meta["license"],
        "keywords": list(meta["keywords"]),
    }


def _gemini_command(description: str, body: str) -> bytes:
    doc = tomlkit.document()
    doc["description"] = description
    doc["prompt"] = tomlkit.string(body.replace("$ARGUMENTS", "{{args}}"), multiline=True)
    return tomlkit.dumps(doc).encode("utf-8")


def _claude_command(frontmatter: dict[str, str], body: str) -> bytes:
    head = "".join(f"{key}: {json.dumps(value)}\n" for key, value in frontmatter.items())
    return f"---\n{head}---\n{body}".encode()


def render_bundle() -> dict[str, bytes]:
    """Every file of the plugin directory, keyed by POSIX path relative to it."""
    meta = load_metadata()
    server_name = meta["server"]["name"]
    files: dict[str, bytes] = {}

    files[".claude-plugin/plugin.json"] = _json(_common_manifest(meta))
    files[".mcp.json"] = _json({"mcpServers": {server_name: _stdio_entry(meta, typed=False)}})

    files["plugin.json"] = _json({"$schema": AGENT_PLUGINS_SCHEMA, **_common_manifest(meta)})
    files["mcp.json"] = _json(
        {"$schema": AGENT_PLUGINS_MCP_SCHEMA, "mcpServers": {server_name: _stdio_entry(meta, typed=True)}}
    )

    files["gemini-extension.json"] = _json(
        {
            "name": meta["name"],
            "version": __version__,
            "description": meta["description"],
            "contextFileName": "GEMINI.md",
            "mcpServers": {
                server_name: {
                    **_stdio_entry(meta, typed=False, extra_args=["--workspace", GEMINI_WORKSPACE_VAR]),
                    **dict(GEMINI_ENTRY_FIELDS),
                }
            },
        }
    )
    files["GEMINI.md"] = load_text("context.md").encode("utf-8")

    for name, command in load_commands().items():
        files[f"commands/{COMMAND_PREFIX}-{name}.md"] = _claude_command(command.frontmatter, command.body)
        files[f"commands/{COMMAND_PREFIX}/{name}.toml"] = _gemini_command(
            command.frontmatter["description"], command.body
        )

    names = skill_names()
    for name in names:
        files[f"skills/{name}/SKILL.md"] = load_skill(name).text.encode("utf-8")

    readme = load_text("README.md").replace("{version}", __version__)
    readme = readme.replace("{skills}", ", ".join(f"`{n}`" for n in names))
    files["README.md"] = readme.encode("utf-8")
    return dict(sorted(files.items()))


@dataclass(frozen=True)
class BundleDiff:
    missing: list[str]  # rendered but absent on disk
    changed: list[str]  # on disk with different bytes
    extra: list[str]  # on disk but no longer rendered

    @property
    def clean(self) -> bool:
        return not (self.missing or self.changed or self.extra)

    def to_dict(self) -> dict[str, list[str]]:
        return {"missing": self.missing, "changed": self.changed, "extra": self.extra}


def _files_on_disk(out: Path) -> set[str]:
    if not out.is_dir():
        return set()
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() or p.is_symlink()}


def check_bundle(out: Path) -> BundleDiff:
    """Compare ``out`` with a fresh render (nothing written)."""
    rendered = render_bundle()
    on_disk = _files_on_disk(out)
    missing = sorted(set(rendered) - on_disk)
    changed = sorted(p for p in set(rendered) & on_disk if (out / p).read_bytes() != rendered[p])
    extra = sorted(on_disk - set(rendered))
    return BundleDiff(missing=missing, changed=changed, extra=extra)


def write_bundle(out: Path) -> BundleDiff:
    """Make ``out`` equal to a fresh render: write what differs (atomically), delete stale files."""
    diff = check_bundle(out)
    rendered = render_bundle()
    for rel in diff.missing + diff.changed:
        atomic_write_bytes(out / rel, rendered[rel])
    for rel in diff.extra:
        os.unlink(out / rel)
    for directory in sorted((p for p in out.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(directory.iterdir()):
            directory.rmdir()
    return diff


__all__ = [
    "AGENT_PLUGINS_MCP_SCHEMA",
    "AGENT_PLUGINS_SCHEMA",
    "BundleDiff",
    "check_bundle",
    "render_bundle",
    "write_bundle",
]
