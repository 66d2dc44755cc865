"""torchax's import-time compatibility layer is needed, and works, on the installed torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_torchax_still_needs_the_compatibility_layer() -> None:
    """Fails once a plain ``import torchax`` works: then delete tpu_agent/runtime/xla/torchax_compat.py's patch."""
    code = "from tpu_agent.runtime.xla import torchax_compat; print(torchax_compat.needs_compat())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True", (
        "torchax imports without the layer now: remove tpu_agent/runtime/xla/torchax_compat.py's patch"
    )


@pytest.mark.slow
def test_the_layer_loads_torchax_and_leaves_torch_unpatched() -> None:
    code = (
        "import torch\n"
        "from tpu_agent.runtime.xla import torchax_compat\n"
        "before = torch._ops.OpOverloadPacket.__getattr__\n"
        "tx = torchax_compat.load()\n"
        "assert torch._ops.OpOverloadPacket.__getattr__ is before\n"
        "assert torch._C._get_privateuse1_backend_name() == 'privateuseone'\n"
        "try:\n"
        "    torch.ops.aten.prod.dim_Dimname\n"
        "except AttributeError:\n"
        "    print('ok', type(tx.default_env()).__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok Environment"
