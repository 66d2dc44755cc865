"""Lint, format and types are part of the test suite, so the README's one test command (and CI) keeps them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["tpu_agent", "tests", "benchmarks"]  # what pyproject.toml excludes (fixtures, examples) stays as written


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_lint_is_clean() -> None:
    result = _run("ruff", "check", "--no-cache", *SOURCES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _run("ruff", "format", "--check", "--no-cache", *SOURCES)
    assert result.returncode == 0, "run `ruff format`:\n" + result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_types_the_package() -> None:
    result = _run("mypy", "tpu_agent")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
