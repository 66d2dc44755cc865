"""Shared by the estimate tests (a module of its own: ``conftest`` is a name every test directory uses)."""

import pytest

from tpu_agent.estimate.compiler import compiler_status

needs_tpu_compiler = pytest.mark.skipif(
    not compiler_status().available, reason=f"TPU compiler unavailable: {compiler_status().reason}"
)
