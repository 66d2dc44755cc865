"""``tpu-agent rules``: the migration rules and the profile diagnostics, listed or explained one at a time.

Both are records (stable code, name, safety or severity, rationale, before/after, reference), so one command
serves both, the way ``ruff rule`` explains any of its rules: ``tpu-agent rules TPU101``,
``tpu-agent rules HS-1``, ``tpu-agent rules --format json``.
"""

from __future__ import annotations

import textwrap
from enum import Enum
from typing import Any

import typer
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from tpu_agent.cli._output import console, handles_errors, print_json
from tpu_agent.errors import TpuAgentError, clipped

# The rule catalogues are imported inside the command: every `tpu-agent` invocation imports this module,
# and the migration rules pull in libcst.

MIGRATION = "migration"
DIAGNOSTIC = "diagnostic"

RULES_HELP = """List the migration rules and the profile diagnostics, or explain one (what it finds, why it
matters, before/after, reference).

Examples:

  tpu-agent rules

  tpu-agent rules TPU101

  tpu-agent rules HS-1

  tpu-agent rules --format json
"""


class RulesFormat(str, Enum):
    text = "text"
    json = "json"


def _records() -> list[dict[str, Any]]:
    """Every record as JSON: migration rules by code, then diagnostics in the order they run."""
    from tpu_agent.migrate.rules import ALL_RULES as MIGRATION_RULES
    from tpu_agent.profile.rules import ALL_RULES as DIAGNOSTICS

    migration = [{"kind": MIGRATION, **MIGRATION_RULES[code].to_dict()} for code in sorted(MIGRATION_RULES)]
    return migration + [{"kind": DIAGNOSTIC, **rule.to_dict()} for rule in DIAGNOSTICS.values()]


def _find(code: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    wanted = code.strip().upper()
    for record in records:
        if record["code"] == wanted:
            return record
    raise TpuAgentError(
        "unknown-rule",
        f"unknown rule or diagnostic code {clipped(code)}",
        "run `tpu-agent rules` to list them (migration rules TPU101 ... TPU8xx, diagnostics such as HS-1 or SH-2)",
    )


def _explain(record: dict[str, Any]) -> None:
    """Print one record the way ``ruff rule`` does: what, why, before/after, where to read more."""
    if record["kind"] == MIGRATION:
        headline = f"  ({record['family']}, {record['safety']})"
    else:
        headline = f"  (profile diagnostic, {record['category']}, {record['severity']})"
    console.print(Text.assemble((record["code"], "bold cyan"), " ", (record["name"], "bold"), headline))
    if record.get("summary"):
        console.print()
        console.print(record["summary"], highlight=False)
    console.print()
    console.print("[bold]Why[/]")
    console.print(Padding(Text(record["rationale"]), (0, 0, 0, 4)), highlight=False)
    for title, code in (("Before", record["before"]), ("After", record["after"])):
        console.print()
        console.print(f"[bold]{title}[/]")
        # Code keeps its lines: wrapping it would change what the example says.
        console.print(Text(textwrap.indent((code or "").rstrip("\n"), "    ")), soft_wrap=True, highlight=False)
    console.print()
    console.print(f"[bold]Reference[/]: {record['reference']}", highlight=False)
    if record["kind"] == MIGRATION:
        console.print(f"[bold]Since torch[/]: {record['since_torch'] or 'any supported version'}", highlight=False)
    else:
        console.print(f"[bold]Needs[/]: {', '.join(record['requires']) or 'any capture'}", highlight=False)


def _print_tables(records: list[dict[str, Any]]) -> None:
    migration = [r for r in records if r["kind"] == MIGRATION]
    table = Table(title=f"{len(migration)} migration rules", title_justify="left")
    for column in ("Code", "Name", "Family", "Safety", "Summary"):
        table.add_column(column, overflow="fold")
    for r in migration:
        table.add_row(r["code"], r["name"], r["family"], r["safety"], r["summary"])
    console.print(table)
    diagnostics = [r for r in records if r["kind"] == DIAGNOSTIC]
    table = Table(title=f"{len(diagnostics)} profile diagnostics", title_justify="left")
    for column in ("Code", "Name", "Category", "Severity", "Why"):
        table.add_column(column, overflow="fold")
    for r in diagnostics:
        table.add_row(r["code"], r["name"], r["category"], r["severity"], r["rationale"])
    console.print(table)
    console.print("Explain one with: tpu-agent rules CODE", style="dim")


def rules(
    code: str | None = typer.Argument(
        None,
        help="A rule or diagnostic code to explain, e.g. TPU101 or HS-1. Omit to list them all.",
        show_default=False,
    ),
    output_format: RulesFormat = typer.Option(
        RulesFormat.text, "--format", "-f", help="text for people, json for agents."
    ),
) -> None:
    records = _records()
    if code is not None:
        record = _find(code, records)
        if output_format == RulesFormat.json:
            print_json(record)
        else:
            _explain(record)
        return
    if output_format == RulesFormat.json:
        print_json(records)
    else:
        _print_tables(records)


def register(app: typer.Typer) -> None:
    """Add ``rules`` to the root app."""
    app.command("rules", help=RULES_HELP)(handles_errors(rules))
