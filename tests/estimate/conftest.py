import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tpu_agent.estimate.compiler import compiler_status  # noqa: E402

needs_tpu_compiler = pytest.mark.skipif(
    not compiler_status().available, reason=f"TPU compiler unavailable: {compiler_status().reason}"
)
