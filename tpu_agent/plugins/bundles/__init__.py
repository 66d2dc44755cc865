"""The canonical plugin source: metadata (``plugin.toml``), skills, commands, context file and README.

Everything a harness installs is rendered from these files by :mod:`tpu_agent.plugins.build`; the MCP
server's prompts reuse the skill bodies, so the workflow an agent is taught is written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import tomlkit

from tpu_agent.errors import TpuAgentError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable


def source_root() -> Traversable:
    return resources.files(__name__)


def load_metadata() -> dict[str, Any]:
    return tomlkit.parse(source_root().joinpath("plugin.toml").read_text(encoding="utf-8")).unwrap()


@dataclass(frozen=True)
class MarkdownDoc:
    """A Markdown file with YAML-style ``key: value`` frontmatter (one line per key, as our sources use)."""

    frontmatter: dict[str, str]
    body: str
    text: str


def parse_markdown(text: str, origin: str) -> MarkdownDoc:
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise TpuAgentError("bad-bundle-source", f"{origin} has no frontmatter", "Start it with a '---' block.")
    try:
        end = next(i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---")
    except StopIteration:
        raise TpuAgentError(
            "bad-bundle-source", f"{origin}: frontmatter is not closed", "Close it with '---'."
        ) from None
    frontmatter: dict[str, str] = {}
    for number, line in enumerate(lines[1:end], start=2):
        key, sep, value = line.partition(":")
        if not sep:
            raise TpuAgentError("bad-bundle-source", f"{origin}:{number}: expected 'key: value'", "Fix the line.")
        frontmatter[key.strip()] = value.strip().strip('"')
    return MarkdownDoc(frontmatter=frontmatter, body="".join(lines[end + 1 :]).lstrip("\n"), text=text)


def skill_names() -> list[str]:
    return sorted(entry.name for entry in source_root().joinpath("skills").iterdir() if entry.is_dir())


def load_skill(name: str) -> MarkdownDoc:
    path = source_root().joinpath("skills", name, "SKILL.md")
    if not path.is_file():
        raise TpuAgentError("unknown-skill", f"no skill {name!r}", f"Known skills: {', '.join(skill_names())}.")
    return parse_markdown(path.read_text(encoding="utf-8"), f"skills/{name}/SKILL.md")


def load_skill_body(name: str) -> str:
    """The instructions of a skill without its frontmatter (what the MCP prompts send)."""
    return load_skill(name).body


def load_commands() -> dict[str, MarkdownDoc]:
    directory = source_root().joinpath("commands")
    return {
        entry.name.removesuffix(".md"): parse_markdown(entry.read_text(encoding="utf-8"), f"commands/{entry.name}")
        for entry in sorted(directory.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".md")
    }


def load_text(name: str) -> str:
    return source_root().joinpath(name).read_text(encoding="utf-8")


__all__ = [
    "MarkdownDoc",
    "load_commands",
    "load_metadata",
    "load_skill",
    "load_skill_body",
    "load_text",
    "parse_markdown",
    "skill_names",
]
