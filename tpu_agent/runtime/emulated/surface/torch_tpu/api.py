"""``torch_tpu.api``: the device entry point of the older TorchTPU guides (``device = api.tpu_device()``).

The 0.2.0 wheel has no ``api`` module (the device loads itself on ``import torch``), but TorchTPU's notebooks and
their tests still call ``api.tpu_device()``; here it returns the process's one device, after making sure the
backend and its ``tpu_dist`` process group are loaded, which is what the notebooks rely on it for.
"""

from __future__ import annotations

import torch

from ._loader import load


def tpu_device() -> torch.device:
    """The process's ``tpu`` device; TorchTPU binds one device per process, so it has no index argument."""
    load()
    return torch.device("tpu")


GUIDE_PAGE = "get_started_tpu"  # the TorchTPU notebook that documents this module (read by tpu_lookup_api)
