"""Fixtures for the plugin tests: a temp copy of the bundled CUDA example and MCP client helpers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cuda_ddp"


@pytest.fixture(autouse=True)
def _no_host_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workspace comes from each test, never from the host's environment (a harness may set these)."""
    for name in ("TPU_AGENT_WORKSPACE", "CLAUDE_PROJECT_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def example(tmp_path: Path) -> Path:
    """A private copy of examples/cuda_ddp (tests migrate it in place)."""
    target = tmp_path / "cuda_ddp"
    shutil.copytree(EXAMPLE, target)
    return target
