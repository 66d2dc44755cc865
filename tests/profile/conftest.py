"""Fixtures for the profile tests: real `tpu-agent profile` runs of the seeded scripts, run once per session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from profile_helpers import Captures


@pytest.fixture(scope="session")
def captures(run_once: Callable[..., Any]) -> Captures:
    return Captures(run_once)


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """TPU compiles of this session go to a cache of their own, never the user's (and every session compiles)."""
    from tpu_agent.fsutil import CACHE_DIR_ENV

    directory = tmp_path_factory.mktemp("compile-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_DIR_ENV, str(directory))
        yield directory
