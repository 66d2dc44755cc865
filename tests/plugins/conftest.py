"""Fixtures for the plugin tests: a temp copy of the bundled CUDA example and MCP client helpers."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cuda_ddp"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def example(tmp_path: Path) -> Path:
    """A private copy of examples/cuda_ddp (tests migrate it in place)."""
    target = tmp_path / "cuda_ddp"
    shutil.copytree(EXAMPLE, target)
    return target


def server_env(**extra: str) -> dict[str, str]:
    """The environment a host hands the stdio server: the SDK passes only an allow-list plus this."""
    env = {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env


PYTHON = sys.executable
