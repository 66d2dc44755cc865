"""tpu_agent.profile: capture a TorchTPU run, diagnose it, and report what to change.

The one name user code needs is :func:`step`, for loops without an optimizer::

    import tpu_agent.profile
    for batch in loader:
        with tpu_agent.profile.step():
            model(batch)

Everything else lives in :mod:`tpu_agent.profile.api`.
"""

from tpu_agent.profile.marker import step

__all__ = ["step"]
