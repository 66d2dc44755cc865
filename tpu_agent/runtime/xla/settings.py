"""Which compiler runs captured graphs on the emulated device: XLA (through JAX) or the op-by-op CPU path.

Set per run with ``tpu-agent run --compiler xla|eager`` or the :data:`COMPILER_ENV` variable (every rank reads
it at activation, as TorchTPU reads its own switches). Kept free of JAX imports so the CLI and the launcher
can name the choices without loading a compiler.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from tpu_agent.errors import TpuAgentError

COMPILER_ENV = "TPU_AGENT_COMPILER"
XLA = "xla"
EAGER = "eager"
COMPILERS = (XLA, EAGER)
# Op by op stays the default until XLA passes the same checks. It passes every runtime, profile and check test, but
# a sampled `tpu-agent check` sweep through XLA (every 10th architecture, DeferAndFuse) passes 27 of 29 where op by
# op passes all: Mamba2's D gradient is 1.2x over the f32 tolerance and AfMoE's zero-initialised router ties (XLA
# picks other experts); recurrent models' steps also compile for minutes (KimiLinear 10, Mamba2 5).
DEFAULT_COMPILER = EAGER


# What the XLA path imports: JAX (a declared dependency) and torchax, which installs only on Python >= 3.11.
XLA_PACKAGES = ("jax", "torchax")


def missing_xla_packages() -> list[str]:
    """The packages the XLA compiler needs that this interpreter cannot import (found without importing them:
    torchax takes seconds to load). A ``None`` entry in ``sys.modules`` is Python's own "import blocked"."""
    missing = []
    for name in XLA_PACKAGES:
        if name in sys.modules:
            if sys.modules[name] is None:
                missing.append(name)
        elif importlib.util.find_spec(name) is None:
            missing.append(name)
    return missing


def require_xla(source: str) -> None:
    """Refuse an explicit XLA choice (``source`` names where it came from) when its packages are missing."""
    missing = missing_xla_packages()
    if not missing:
        return
    python = tuple(sys.version_info[:2])
    version = ".".join(str(part) for part in python)
    if "torchax" in missing and python < (3, 11):
        hint = (
            f"torchax (the XLA lowering) needs Python >= 3.11 and this is Python {version}: run tpu-agent from a "
            f"Python 3.11+ environment, or use --compiler {EAGER} (graphs run op by op)"
        )
    else:
        hint = f"pip install {' '.join(_REQUIREMENTS[name] for name in missing)}, or use --compiler {EAGER}"
    raise TpuAgentError(
        "xla-compiler-unavailable",
        f"{source} selects the XLA compiler, but {', '.join(missing)} cannot be imported by {sys.executable}",
        hint,
    )


_REQUIREMENTS = {"jax": "'jax'", "torchax": "'torchax>=0.0.13'"}


def compiler() -> str:
    """The compiler the environment selects; an unknown value is refused with the accepted spellings, and an
    explicit ``xla`` whose packages are missing with what to install."""
    return resolve(os.environ.get(COMPILER_ENV))


def resolve(value: str | None) -> str:
    """The compiler a ``TPU_AGENT_COMPILER`` value selects (``None`` or empty: the default, which falls back to op
    by op where the XLA packages cannot be imported); what :func:`compiler` reads, for callers that prepare
    another process's environment (``tpu-agent check`` names the compiler its workers will use)."""
    value = (value or "").strip().lower()
    if not value:
        return DEFAULT_COMPILER if DEFAULT_COMPILER == EAGER or not missing_xla_packages() else EAGER
    if value not in COMPILERS:
        raise TpuAgentError(
            "bad-compiler",
            f"{COMPILER_ENV}={value!r} is not a compiler",
            f"use one of {', '.join(COMPILERS)} (tpu-agent run --compiler ...)",
        )
    if value == XLA:
        require_xla(f"{COMPILER_ENV}=xla")
    return value


def describe() -> tuple[str, str]:
    """The compiler the environment selects and why (``tpu-agent doctor``): the variable that chose it, or the
    default."""
    value = os.environ.get(COMPILER_ENV, "").strip()
    return resolve(value), f"{COMPILER_ENV}={value}" if value else "default"


def uses_xla() -> bool:
    return compiler() == XLA


# DeferAndFuse graphs go through XLA with the compiler; ``TPU_AGENT_XLA_DEFERRED=0`` keeps them on the op-by-op
# executor while torch.compile graphs still compile (to tell the two apart when something differs).
XLA_DEFERRED_ENV = "TPU_AGENT_XLA_DEFERRED"


def deferred_uses_xla() -> bool:
    """Whether DeferAndFuse graphs go to the XLA executor: with ``--compiler xla``, unless switched off."""
    return uses_xla() and os.environ.get(XLA_DEFERRED_ENV, "").strip() != "0"


def install_deferred_executor() -> None:
    """Hand DeferAndFuse graphs to the XLA executor when this run compiles them.

    The compiler stack is built on the emulated device, so the device's recorder never imports it: whoever
    activates the device (``tpu_agent.runtime.api.activate``) plugs it in here."""
    if deferred_uses_xla():
        from tpu_agent.runtime.emulated import deferred

        deferred.set_executor(_xla_executor)


def announce_compiler_outputs() -> None:
    """At activation: refuse a tier-2 cache value that is not a name; without the XLA compiler, say once that no HLO
    dump or tier-2 executable asked for will be written, and why (:mod:`.outputs`)."""
    from tpu_agent.runtime.xla import outputs

    outputs.tier2_directory()
    if not uses_xla():
        outputs.explain_without_xla()


def _xla_executor() -> Any:
    """The XLA executor, imported at the first flush: JAX and the lowering take seconds to import, which a run
    that never defers (Strict mode, or a script that only starts) should not pay before its first line."""
    from tpu_agent.runtime.xla.executor import XlaExecutor

    return XlaExecutor()
