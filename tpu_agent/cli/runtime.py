"""CLI commands of ``tpu_agent.runtime``: argument parsing and rendering only."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this group's commands to the root app."""
