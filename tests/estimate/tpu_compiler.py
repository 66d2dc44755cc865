"""The skip mark for tests that need libtpu: it comes with the ``[estimate]`` extra (Linux x86_64 only)."""

import pytest

from tpu_agent.estimate.compiler import compiler_status

needs_tpu_compiler = pytest.mark.skipif(
    not compiler_status().available, reason=f"TPU compiler unavailable: {compiler_status().reason}"
)
