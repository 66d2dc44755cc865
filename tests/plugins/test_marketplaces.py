"""The repo root is itself a Claude Code and Codex marketplace whose one plugin is the built ``plugin/``."""

from __future__ import annotations

import json
from pathlib import Path

from tpu_agent import __version__

ROOT = Path(__file__).resolve().parents[2]


def _plugin_dir(source: str | dict[str, str]) -> Path:
    path = source if isinstance(source, str) else source["path"]
    return (ROOT / path).resolve()


def test_claude_marketplace_points_at_the_built_plugin_with_its_version() -> None:
    market = json.loads((ROOT / ".claude-plugin" / "marketplace.json").read_text())
    (entry,) = market["plugins"]
    manifest = json.loads((_plugin_dir(entry["source"]) / ".claude-plugin" / "plugin.json").read_text())
    assert entry["name"] == manifest["name"] == "tpu-agent"
    assert entry["version"] == manifest["version"] == __version__


def test_codex_marketplace_points_at_the_built_plugin() -> None:
    market = json.loads((ROOT / ".agents" / "plugins" / "marketplace.json").read_text())
    (entry,) = market["plugins"]
    plugin_dir = _plugin_dir(entry["source"])
    manifest = json.loads((plugin_dir / "plugin.json").read_text())
    assert entry["name"] == manifest["name"]
    assert (plugin_dir / "mcp.json").is_file()
