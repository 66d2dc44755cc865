"""The compiler outputs TorchTPU's docs promise, where they go on the emulated device, and why none when nothing compiles.

* **HLO dumps.** ``XLA_FLAGS="--xla_dump_hlo_as_text --xla_dump_to=DIR"`` is read by XLA itself, so with
  ``--compiler xla`` every executable the emulation compiles leaves its HLO text in DIR (before and after
  optimisation), as on a TPU host. An executable loaded from a persistent cache is not compiled, so it is not
  dumped again (the same holds on TorchTPU).
* **The tier-2 compilation cache.** ``TORCH_TPU_TIER2_COMPILATION_CACHE=<name>`` (a name, not a path) keeps
  the host's executables in ``/dev/shm/torch_tpu_cache/<name>`` as ``.bin`` files; with ``--compiler xla`` the
  emulation's XLA executables go there (:mod:`.jax_setup`), bounded in size, instead of tpu-agent's own cache
  folder. ``TPU_AGENT_TIER2_ROOT`` moves the root (tests, hosts without ``/dev/shm``); ``disabled`` turns the
  cache off.
* **Without the XLA compiler** (``--compiler eager``, the default) graphs run op by op and nothing is compiled,
  so neither is written: :func:`explain_without_xla` says so once, with what does count (the cache statistics)
  and how to get the files.

No JAX import here: the statement is made at activation, before (and without) the compiler stack.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.envvars import TIER2_CACHE_ENV, xla_flag
from tpu_agent.runtime.run_scope import runs_itself

TIER2_ROOT_ENV = "TPU_AGENT_TIER2_ROOT"
TIER2_ROOT = "/dev/shm/torch_tpu_cache"
DUMP_FLAG = "--xla_dump_to"


def hlo_dump_directory(flags: str | None) -> str | None:
    """The directory ``XLA_FLAGS`` asks XLA to dump into (the last mention wins), None when none."""
    return xla_flag(flags, DUMP_FLAG) or None


def tier2_directory() -> Path | None:
    """Where TorchTPU's tier-2 cache named by ``TORCH_TPU_TIER2_COMPILATION_CACHE`` lives; None when the variable is
    unset, empty or ``disabled``. A value that is not a plain name is refused (TorchTPU takes a name, not a path):
    raises TpuAgentError."""
    name = os.environ.get(TIER2_CACHE_ENV, "").strip()
    if not name or name == "disabled":
        return None
    if "/" in name or name in (".", ".."):
        raise TpuAgentError(
            "bad-tier2-cache-name",
            f"{TIER2_CACHE_ENV}={name!r} is not a cache name: TorchTPU takes a name, not a path",
            f"set e.g. {TIER2_CACHE_ENV}=default (the cache then lives in {TIER2_ROOT}/default)",
        )
    return Path(os.environ.get(TIER2_ROOT_ENV) or TIER2_ROOT) / name


def explain_without_xla() -> str | None:
    """When the run asks for compiler outputs but compiles nothing, say so on stderr once (rank 0 of the run, at
    activation) with why; returns the statement (None when there is nothing to say)."""
    wanted = []
    dump = hlo_dump_directory(os.environ.get("XLA_FLAGS"))
    if dump is not None:
        wanted.append(f"HLO dumps in {dump} (XLA_FLAGS {DUMP_FLAG})")
    tier2 = tier2_directory()
    if tier2 is not None:
        wanted.append(f".bin executables in {tier2} ({TIER2_CACHE_ENV})")
    if not wanted:
        return None
    statement = (
        f"tpu-agent: nothing is written for {'; '.join(wanted)}: this run's graphs run op by op on the CPU emulation "
        "and no XLA executable is compiled. torch.tpu._get_cache_stats() still counts the ops and graphs TorchTPU "
        "would compile. Run with --compiler xla (TPU_AGENT_COMPILER=xla) to compile them with XLA and get these files."
    )
    # one line per run, as the backend line is, not a Python warning frame: from rank 0's own process, not from the
    # processes it starts (they inherit RANK=0 and activate through the autoload)
    if os.environ.get("RANK", "0") == "0" and runs_itself():
        print(statement, file=sys.stderr, flush=True)
    return statement
