"""``torch_tpu._loader``: ``load()`` makes the ``tpu`` device live in this process (idempotent).

The real module is what torch's device-backend autoload calls; Ray Train's TPU device manager also calls
``load()`` itself. Here it activates the emulation (``tpu_agent.runtime.api.activate``), which is what the
``torch.backends`` entry point does in every process of a run (:mod:`tpu_agent.runtime.autoload`).
"""

from __future__ import annotations


def load() -> None:
    """Activate the emulated ``tpu`` device in this process (a no-op once active, or while it is activating)."""
    import torch  # noqa: F401 - in a run, torch's autoload activates the device here, as the wheel's does

    from tpu_agent.runtime import autoload

    autoload.activate()


GUIDE_PAGE = "get_started_tpu"  # the TorchTPU notebook that documents this module (read by tpu_lookup_api)
