"""Unified diffs of a plan, for ``--diff`` (the dry run TorchFix users know) and for reviews."""

from __future__ import annotations

import difflib

from tpu_agent.migrate.model import FileResult, Plan


def _lines(data: bytes) -> list[str]:
    # Display only: undecodable bytes must not stop a diff of the parts that are text.
    return data.decode("utf-8", errors="replace").splitlines(keepends=True)


def file_diff(result: FileResult) -> str:
    """The unified diff from the file on disk to its migrated bytes ('' when the file does not change)."""
    if result.migrated_bytes is None:
        return ""
    before = _lines(result.path.read_bytes())
    after = _lines(result.migrated_bytes)
    chunks = difflib.unified_diff(before, after, f"a/{result.display_path}", f"b/{result.display_path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in chunks)


def unified_diff(plan: Plan) -> str:
    """All changed files' diffs, in plan order, ready for ``git apply`` or ``patch -p1``."""
    return "".join(file_diff(result) for result in plan.changed_files)
