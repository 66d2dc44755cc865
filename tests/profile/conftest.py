"""Fixtures for the profile tests: real `tpu-agent profile` runs of the seeded scripts, cached per session."""

from __future__ import annotations

import pytest
from profile_helpers import Captures


@pytest.fixture(scope="session")
def captures(tmp_path_factory: pytest.TempPathFactory) -> Captures:
    return Captures(tmp_path_factory.mktemp("profile-captures"))
