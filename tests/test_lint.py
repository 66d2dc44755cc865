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


def test_pre_commit_hooks_use_the_installed_tools() -> None:
    """The contributor hooks (CONTRIBUTING.md) are valid pre-commit config, and each is a local hook whose command is
    a tool the dev extra installed beside this interpreter, so a commit never downloads a hook environment."""
    import yaml

    config_path = ROOT / ".pre-commit-config.yaml"
    validated = _run("pre_commit", "validate-config", str(config_path))
    assert validated.returncode == 0, validated.stdout + validated.stderr
    hooks = []
    for repo in yaml.safe_load(config_path.read_text(encoding="utf-8"))["repos"]:
        assert repo["repo"] == "local", repo["repo"]
        hooks.extend(repo["hooks"])
    assert {hook["id"] for hook in hooks} == {"ruff-check", "ruff-format", "mypy"}
    for hook in hooks:
        assert hook["language"] == "system", hook["id"]
        tool = hook["entry"].split()[0]
        assert (Path(sys.executable).parent / tool).is_file(), f"{hook['id']}: {tool} is not installed by the dev extra"
