"""Whether the TPU compiler (libtpu, driven through JAX) is usable on this host, and what to do when it is not.

A fact about what is installed, like the backend choice beside it (:mod:`.select`): ``tpu-agent doctor``
reports it, and ``tpu-agent estimate`` (:mod:`tpu_agent.estimate.compiler`) refuses to start without it. Read
from distribution metadata only: importing libtpu is slow and noisy.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from typing import Any

from tpu_agent.runtime.select import package_version

INSTALL_HINT = 'pip install "tpu-agent[estimate]" (adds jax[tpu], whose libtpu wheel is Linux x86_64 only)'


@dataclass(frozen=True)
class CompilerStatus:
    """Whether the TPU compiler can be used on this machine, and what to do when it cannot."""

    available: bool
    libtpu_version: str | None
    jax_version: str | None
    reason: str
    hint: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "libtpu_version": self.libtpu_version,
            "jax_version": self.jax_version,
            "reason": self.reason,
            "hint": self.hint,
        }


def compiler_status() -> CompilerStatus:
    """Find libtpu and jax without importing libtpu (importing it is slow and noisy); say what is missing."""
    jax_version = package_version("jax")
    libtpu_version = package_version("libtpu") or package_version("libtpu-nightly")
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        reason = f"libtpu is published for Linux x86_64 only (this is {sys.platform} {platform.machine()})"
        return CompilerStatus(False, libtpu_version, jax_version, reason, "run estimate on a Linux x86_64 machine")
    if jax_version is None:
        return CompilerStatus(False, libtpu_version, None, "jax is not installed", INSTALL_HINT)
    if libtpu_version is None:
        return CompilerStatus(False, None, jax_version, "libtpu (the TPU compiler) is not installed", INSTALL_HINT)
    return CompilerStatus(True, libtpu_version, jax_version, f"libtpu {libtpu_version} with jax {jax_version}", "")
