"""JAX set up for the emulated device's executables, once, before anything asks for a device or compiles.

* **The CPU platform.** Naming it keeps an installed libtpu (the estimate extra) from being initialised for
  execution, which would print its "no TPU here" errors into every run.
* **A persistent compilation cache** in :func:`tpu_agent.fsutil.user_cache_dir` ``("xla")``: a second run of
  the same script loads its executables instead of compiling them again, as TorchTPU's host-local ("tier-2")
  compilation cache does. XLA's compile is most of a first step (a tiny GPT-2's three DeferAndFuse graphs: 38 s of
  compile in the first run, 5-6 s of tracing in the next). JAX keys each entry by the program, the compile
  options and its own version, so a changed model or JAX never loads a stale one. ``TPU_AGENT_XLA_PERSIST=0``
  turns it off, as does TorchTPU's own ``TORCH_TPU_TIER2_COMPILATION_CACHE=disabled``; a cache directory set for JAX itself (``JAX_COMPILATION_CACHE_DIR``) is left as it is; a
  directory that cannot be created leaves the cache off.

Importing this module does the set-up; :mod:`.arrays`, the first of the stack to touch JAX devices, imports it.
"""

from __future__ import annotations

import os

import jax

from tpu_agent.fsutil import user_cache_dir
from tpu_agent.runtime.envvars import TIER2_CACHE_ENV, XLA_PERSIST_ENV

MAX_CACHE_BYTES = 1024**3

jax.config.update("jax_platforms", "cpu")


def persist_executables() -> None:
    """Point JAX's persistent compilation cache at tpu-agent's cache directory, unless switched off or set."""
    switched_off = (
        os.environ.get(XLA_PERSIST_ENV, "").strip() == "0" or os.environ.get(TIER2_CACHE_ENV, "").strip() == "disabled"
    )
    if switched_off or jax.config.jax_compilation_cache_dir:
        return
    directory = user_cache_dir("xla")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # bounded, least recently used out; with a bound JAX also reads and writes entries under a file lock, so ranks
    # compiling the same graphs at once never read one another's half-written entry
    jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
    # every executable, however quick its compile: a small graph's compile still costs more than reading it back
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


persist_executables()
