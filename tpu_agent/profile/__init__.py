"""tpu_agent.profile: capture a TorchTPU run, diagnose it, and report what to change.

The one name user code needs is :func:`step`, for loops without an optimizer::

    import tpu_agent.profile
    for batch in loader:
        with tpu_agent.profile.step():
            model(batch)

Everything else lives in :mod:`tpu_agent.profile.api`. ``step`` is imported on first use: every
``tpu-agent`` command imports this package (for the profile defaults), and only a profiled process needs
the capture probes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["step"]


def __getattr__(name: str) -> Any:
    if name == "step":
        from tpu_agent.profile.capture import step

        return step
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
