"""Unified diffs as the profile's fixes write them: the file one edits, applying one strictly against its context
(as ``patch`` without fuzz), and where a line of the original is after it. Used by :mod:`tpu_agent.profile.verify`
to run a fix on a copy and read its finding again."""

from __future__ import annotations

import re
from pathlib import Path

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class DiffError(Exception):
    """The diff cannot be applied (the reason is the message): the fix is wrong, not the environment."""


def diff_file(diff: str) -> str:
    """The file a diff edits, as its ``+++`` line names it (without git's ``b/``)."""
    for line in diff.splitlines():
        if line.startswith("+++ "):
            name = line[4:].split("\t", 1)[0].strip()
            return name[2:] if name.startswith("b/") else name
    raise DiffError("the diff names no file")


def change_identity(diff: str, cwd: Path) -> list[str] | None:
    """What a diff changes whatever directory its header was written from: the edited file's absolute path and
    the hunks. Diffs name files relative to the working directory, which differs between the profile that
    verified a diff and a later ``diagnose`` of the capture (an MCP server, another shell). None without a file."""
    try:
        name = diff_file(diff)
    except DiffError:
        return None
    hunks = diff[diff.find("\n@@") + 1 :] if "\n@@" in diff else ""
    return [str((cwd / name).resolve()), hunks]


def apply_diff(text: str, diff: str) -> str:
    """``text`` with the unified ``diff`` applied; every context and removed line must match (as ``patch`` without
    fuzz checks), else :class:`DiffError`."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    position = 0
    diff_lines = diff.splitlines(keepends=True)
    index = 0
    while index < len(diff_lines):
        match = _HUNK.match(diff_lines[index])
        index += 1
        if match is None:
            continue
        start = int(match[1]) - (0 if match[2] == "0" else 1)
        if start < position:
            raise DiffError("the diff's hunks overlap")
        out.extend(lines[position:start])
        position = start
        while index < len(diff_lines) and not diff_lines[index].startswith("@@"):
            line = diff_lines[index]
            index += 1
            kind, body = line[:1], line[1:]
            if kind in (" ", "-"):
                if position >= len(lines) or lines[position].rstrip("\r\n") != body.rstrip("\r\n"):
                    raise DiffError(f"the diff does not apply at line {position + 1}")
                if kind == " ":
                    out.append(lines[position])
                position += 1
            elif kind == "+":
                out.append(body if body.endswith("\n") else body + "\n")
    out.extend(lines[position:])
    return "".join(out)


def moved_lines(diff: str, line: int) -> set[int]:
    """Where line ``line`` of the file ``diff`` edits is in the patched file: its new number (lines inserted or
    removed above it shift it), or the numbers of the lines that replaced it when the diff edited it (none when it
    was only removed)."""
    old = new = shift = 0
    hit, added = False, list[int]()
    for text in diff.splitlines():
        match = _HUNK.match(text)
        if match:
            if hit:
                return set(added)
            old, new = int(match[1]) + (match[2] == "0"), int(match[3]) + (match[4] == "0")
            if line < old:
                return {line + shift}
            added = []
            continue
        if not old:  # the ---/+++ header
            continue
        kind = text[:1]
        if kind == " ":
            if hit:
                return set(added)
            if old == line:
                return {new}
            old, new, added = old + 1, new + 1, []
        elif kind == "-":
            hit = hit or old == line
            old += 1
        elif kind == "+":
            added.append(new)
            new += 1
        shift = new - old
    return set(added) if hit else {line + shift}
