"""Launch scripts and configs (``*.sh``, ``.env``, YAML, Dockerfiles): line-level fixes, bytes kept exactly.

Only what can be changed without understanding the file is changed: environment variable names, NCCL
settings, launcher flags and ``device``/``backend`` values; comment lines are never touched. Lines keep
their own newline (CRLF stays CRLF) and undecodable bytes survive (surrogate escapes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tpu_agent.migrate.engine.context import TextContext, decide, todo_comment
from tpu_agent.migrate.model import FileKind, Finding, MigrateOptions, Rule
from tpu_agent.migrate.rules._base import TextFix

_KEYWORD_ONLY = frozenset({"", "export", "ENV"})


def _split_newline(line: str) -> tuple[str, str]:
    stripped = line.rstrip("\r\n")
    return stripped, line[len(stripped) :]


def migrate_text(
    data: bytes,
    kind: FileKind,
    display_path: str,
    options: MigrateOptions,
    rules: Mapping[str, Rule],
    fixes: Sequence[TextFix],
) -> tuple[bytes | None, list[Finding]]:
    ctx = TextContext(options, kind)
    applicable = [fix for fix in fixes if kind in fix.kinds]
    text = data.decode("utf-8", "surrogateescape")
    out: list[str] = []
    findings: list[Finding] = []
    for lineno, line in enumerate(text.splitlines(keepends=True), start=1):
        body, newline = _split_newline(line)
        stripped = body.lstrip()
        if stripped.startswith("#"):
            out.append(line)
            continue
        todos: list[str] = []
        dropped = False
        for fix in applicable:
            for match in reversed(list(fix.pattern.finditer(body))):
                replacement = fix.replace(ctx, match)
                message = fix.message(ctx, match)
                fixed = decide(options, rules, fix.code, replacement is not None)
                if fixed is None:
                    continue
                findings.append(
                    Finding(
                        fix.code,
                        display_path,
                        lineno,
                        match.start() + 1,
                        message,
                        rules[fix.code].safety_for(options.target),
                        fixed,
                        lineno,
                        match.end() + 1,
                    )
                )
                if fixed:
                    body = body[: match.start()] + (replacement or "") + body[match.end() :]
                    dropped = dropped or fix.drop_line
                elif options.annotate:
                    todos.append(todo_comment(fix.code, message))
        indent = line[: len(line) - len(line.lstrip())] if stripped else ""
        for todo in dict.fromkeys(reversed(todos)):
            comment = indent.rstrip("\r\n") + todo
            if not (out and out[-1].rstrip("\r\n") == comment):
                out.append(comment + (newline or "\n"))
        if dropped and body.strip() in _KEYWORD_ONLY:
            continue
        out.append(body + newline)
    findings.sort(key=lambda f: (f.line, f.column, f.code))
    new = "".join(out)
    return (new.encode("utf-8", "surrogateescape") if new != text else None), findings
