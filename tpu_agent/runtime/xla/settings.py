"""Which compiler runs captured graphs on the emulated device: XLA (through JAX) or the op-by-op CPU path.

Set per run with ``tpu-agent run --compiler xla|eager`` or the :data:`COMPILER_ENV` variable (every rank reads
it at activation, as TorchTPU reads its own switches). Kept free of JAX imports so the CLI and the launcher
can name the choices without loading a compiler.
"""

from __future__ import annotations

import os

COMPILER_ENV = "TPU_AGENT_COMPILER"
XLA = "xla"
EAGER = "eager"
COMPILERS = (XLA, EAGER)
# Eager stays the default until the XLA path passes every runtime and profile test (see README, known limits).
DEFAULT_COMPILER = EAGER


def compiler() -> str:
    """The compiler the environment selects; an unknown value is refused with the accepted spellings."""
    value = os.environ.get(COMPILER_ENV, "").strip().lower() or DEFAULT_COMPILER
    if value not in COMPILERS:
        raise ValueError(f"{COMPILER_ENV}={value!r} is not a compiler; use one of {', '.join(COMPILERS)}")
    return value


def uses_xla() -> bool:
    return compiler() == XLA


# DeferAndFuse graphs through XLA are experimental: a separate opt-in until they pass the training test again
# (tests/runtime/test_xla.py: the attention graphs of the restructured recorder give wrong losses).
XLA_DEFERRED_ENV = "TPU_AGENT_XLA_DEFERRED"


def deferred_uses_xla() -> bool:
    """Whether DeferAndFuse graphs go to the XLA executor (``--compiler xla`` plus the experimental switch)."""
    return uses_xla() and os.environ.get(XLA_DEFERRED_ENV, "").strip() == "1"


def install_deferred_executor() -> None:
    """Hand DeferAndFuse graphs to the XLA executor when this run compiles them.

    The compiler stack is built on the emulated device, so the device's recorder never imports it: whoever
    activates the device (``tpu_agent.runtime.api.activate``) plugs it in here."""
    if deferred_uses_xla():
        from tpu_agent.runtime.emulated import deferred
        from tpu_agent.runtime.xla.executor import XlaExecutor

        deferred.executor_factory = XlaExecutor
