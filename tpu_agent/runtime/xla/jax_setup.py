"""JAX set up for the emulated device's executables, once, before anything asks for a device or compiles.

* **The CPU platform.** Naming it keeps an installed libtpu (the estimate extra) from being initialised for
  execution, which would print its "no TPU here" errors into every run.
* **A persistent compilation cache** in :func:`tpu_agent.fsutil.user_cache_dir` ``("xla")``, or in TorchTPU's
  tier-2 folder ``/dev/shm/torch_tpu_cache/<name>`` as ``.bin`` files when ``TORCH_TPU_TIER2_COMPILATION_CACHE``
  names one (:mod:`.outputs`): a second run of
  the same script loads its executables instead of compiling them again, as TorchTPU's host-local ("tier-2")
  compilation cache does. XLA's compile is most of a first step (measured in docs/runtime.md, "Measurements behind the
  design"). JAX keys each entry by the program, the compile
  options and its own version, so a changed model or JAX never loads a stale one. ``TPU_AGENT_XLA_PERSIST=0``
  turns it off, as does TorchTPU's own ``TORCH_TPU_TIER2_COMPILATION_CACHE=disabled``; a cache directory set for JAX itself (``JAX_COMPILATION_CACHE_DIR``) is left as it is; a
  directory that cannot be created leaves the cache off.

* **64-bit types as they are.** TorchTPU runs int64 and float64 as XLA's S64 and F64, so x64 is on: token ids
  past int32, hashes and float64 statistics keep their values (with JAX's 32-bit default, compiled
  ``[2**40 + 5] + 1`` gave 6, silently). A Python float in a graph is a double, weakly typed as in torch.

* **Quiet about its own choices.** A DataLoader's worker processes, forked after JAX started its threads, would
  each print JAX's fork warning, though workers only load data and never run an executable. That warning is
  filtered by its exact text; every other warning still reaches the user.

* **Linear algebra XLA expands itself.** On CPU, JAX lowers a triangular solve and a Cholesky factorisation
  to LAPACK custom calls that split their batch onto XLA's intra-op thread pool and block until it is done; with
  several such calls in flight at once (Qwen3.5's gated delta rule issues independent batched solves, forward and
  backward) every pool thread can sit waiting for work queued behind it, and the executable hangs forever at
  0 % CPU. Their generic lowerings, the HLO ops XLA expands into loops of ordinary ops, as it does for a TPU, run
  without the pool's blocking; they are registered for the CPU platform in place of the custom calls. This
  names JAX-internal lowering functions (``jax._src``): :func:`expand_linear_algebra_in_xla` says when they
  are gone, and a test fails then.

Importing this module does the set-up; :mod:`.arrays`, the first of the stack to touch JAX devices, imports it.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import jax

from tpu_agent.fsutil import not_private, user_cache_dir
from tpu_agent.runtime.envvars import TIER2_CACHE_ENV, XLA_PERSIST_ENV
from tpu_agent.runtime.xla import outputs

MAX_CACHE_BYTES = 1024**3

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_enable_x64", True)
warnings.filterwarnings(
    "ignore", message=r"os\.fork\(\) was called\. os\.fork\(\) is incompatible with multithreaded code"
)


def persist_executables() -> None:
    """Point JAX's persistent compilation cache at TorchTPU's tier-2 folder when the run names one, else at
    tpu-agent's cache directory, unless switched off or set."""
    switched_off = (
        os.environ.get(XLA_PERSIST_ENV, "").strip() == "0" or os.environ.get(TIER2_CACHE_ENV, "").strip() == "disabled"
    )
    if switched_off or jax.config.jax_compilation_cache_dir:
        return
    tier2 = outputs.tier2_directory()
    if tier2 is not None:
        tier2 = _private_tier2(tier2)
    directory = tier2 if tier2 is not None else user_cache_dir("xla")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return
    if tier2 is not None and not name_entries_as_executables():
        return  # this JAX names its entries otherwise: tier-2 stays empty rather than holding other files
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # bounded, least recently used out; with a bound JAX also reads and writes entries under a file lock, so ranks
    # compiling the same graphs at once never read one another's half-written entry
    jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
    # every executable, however quick its compile: a small graph's compile still costs more than reading it back
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _private_tier2(tier2: Path) -> Path | None:
    """``tier2`` made if need be, or None (said on stderr; tpu-agent's own cache is used) when it is not this user's
    alone: executables are loaded from it and run, and ``/dev/shm`` is writable by every user of the host."""
    try:
        tier2.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        shared: str | None = f"{tier2}: {error.strerror}"
    else:
        shared = not_private(tier2, up_to=tier2.parent)
    if shared is None:
        return tier2
    print(f"tpu-agent: tier-2 cache not used ({shared}); executables go to tpu-agent's own cache", file=sys.stderr)
    return None


def name_entries_as_executables() -> bool:
    """Name the cache's entries ``<key>.bin``, as TorchTPU's tier-2 files are named (each is a serialized XLA
    executable and its compile time). This sets a JAX-internal constant (``jax._src.lru_cache``); ``False`` when
    this JAX has no such constant, and a test fails then."""
    try:
        from jax._src import lru_cache
    except ImportError:
        return False
    if not hasattr(lru_cache, "_CACHE_SUFFIX"):
        return False
    lru_cache._CACHE_SUFFIX = ".bin"
    return True


persist_executables()


def expand_linear_algebra_in_xla() -> bool:
    """Lower ``triangular_solve`` and ``cholesky`` to the HLO ops XLA expands, not to LAPACK custom calls (see
    the module docstring); ``False`` when this JAX no longer has the generic lowerings under these names."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.lax import linalg

        generic = (
            (linalg.triangular_solve_p, linalg._triangular_solve_lowering),
            (linalg.cholesky_p, linalg._cholesky_lowering),
        )
    except (ImportError, AttributeError):
        return False
    for primitive, lowering in generic:
        mlir.register_lowering(primitive, lowering, platform="cpu")
    return True


expand_linear_algebra_in_xla()
