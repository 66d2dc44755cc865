"""The README stays a five-minute read, and the documents it leads to are really there.

The README is kept short by moving detail into docs/ and CONTRIBUTING.md; that only works while every link
between them resolves, to the file and to the heading an anchor names, and while every page in docs/ can still
be reached from the README.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 150
LINKED_DOCUMENTS = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"`[^`]*`")
_EXTERNAL = ("http://", "https://", "mailto:")


def _prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks (which hold no links or headings). An unclosed fence
    would hide the rest of the file from every check here, so it is an error itself."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    assert not fenced, f"{path.relative_to(ROOT)}: a code fence is never closed"
    return lines


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: inline markup dropped, lower case, punctuation removed, spaces as dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose_lines(path):
        match = _HEADING.match(line)
        if not match:
            continue
        anchor = github_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return frozenset(found)


def relative_links(path: Path) -> list[str]:
    """The link targets of a Markdown file that point inside the repository."""
    targets = []
    for line in _prose_lines(path):
        for target in _LINK.findall(_CODE_SPAN.sub("``", line)):
            if not target.startswith(_EXTERNAL):
                targets.append(target)
    return targets


def _resolve(source: Path, target: str) -> tuple[Path, str]:
    file_part, _, anchor = target.partition("#")
    return ((source.parent / file_part).resolve() if file_part else source), anchor


def test_readme_is_under_the_line_budget() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < MAX_README_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_every_relative_link_reaches_a_file_and_heading() -> None:
    broken = []
    for source in LINKED_DOCUMENTS:
        for target in relative_links(source):
            path, anchor = _resolve(source, target)
            if not path.exists():
                broken.append(f"{source.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and (path.suffix != ".md" or anchor not in anchors(path)):
                broken.append(f"{source.relative_to(ROOT)}: {target} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached, queue = {README.resolve()}, [README]
    while queue:
        source = queue.pop()
        for target in relative_links(source):
            path, _ = _resolve(source, target)
            if path.suffix == ".md" and path.is_file() and path not in reached:
                reached.add(path)
                queue.append(path)
    unreached = [p.relative_to(ROOT) for p in LINKED_DOCUMENTS if p.resolve() not in reached]
    assert not unreached, f"not linked from README.md, directly or through another page: {unreached}"


def test_anchor_rule_matches_githubs_on_known_headings() -> None:
    """The anchors the links above rely on, as GitHub renders them for this repository's kinds of heading."""
    assert github_anchor("Agents: MCP server and plugins") == "agents-mcp-server-and-plugins"
    assert github_anchor("`options`") == "options"
    assert github_anchor("Verified diffs: `agent_change.verification` and `verification`") == (
        "verified-diffs-agent_changeverification-and-verification"
    )
    assert github_anchor("The XLA compiler (`--compiler xla`)") == "the-xla-compiler---compiler-xla"
