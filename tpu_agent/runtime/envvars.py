"""The environment a run is configured through: tpu-agent's own variables and TorchTPU's.

Every rank is configured by environment variables only, because that is how TorchTPU itself is configured
(its C++ side reads each variable once, before the first device use; reference §8.1). Using TorchTPU's own
switches for the eager mode means ``--eager-mode debug`` means exactly the same thing on a TPU host running
the real wheel as it does under the emulation.
"""

from __future__ import annotations

import os
import shlex
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

from tpu_agent.chips import Chip
from tpu_agent.runtime.events import EVENTS_DIR_ENV
from tpu_agent.runtime.run_scope import BACKEND_ENV  # the resolved backend: "emulated" or "torch_tpu"

CHIP_ENV = "TPU_AGENT_CHIP"  # --chip in canonical spelling: a generation ("v6e") or a slice ("v6e-4")
HOOKS_ENV = "TPU_AGENT_HOOKS"  # comma-separated "module:function" run in every rank before user code
XLA_PERSIST_ENV = "TPU_AGENT_XLA_PERSIST"  # "0": XLA executables are not kept between runs (xla/jax_setup.py)
# TorchTPU's switch for its host-local compilation cache; "disabled" also keeps the emulation's executables unkept
TIER2_CACHE_ENV = "TORCH_TPU_TIER2_COMPILATION_CACHE"

LAUNCH_BLOCKING_ENV = "TORCH_TPU_LAUNCH_BLOCKING"
DEFER_AND_FUSE_ENV = "TORCH_TPU_DEFER_AND_FUSE"
# Older TorchTPU builds read these spellings; a stale one in the user's shell must not override the flag.
LEGACY_EAGER_ENVS = ("TPU_LAUNCH_BLOCKING", "TPU_DEFER_AND_FUSE")

# Variables worth recording with a run (RunInfo) and showing in doctor.
RECORDED_PREFIXES = ("TORCH_TPU_", "TPU_", "XLA_", "LIBTPU_", "TPU_AGENT_", "PJRT_")

__all__ = [
    "BACKEND_ENV",
    "CHIP_ENV",
    "HOOKS_ENV",
    "TIER2_CACHE_ENV",
    "XLA_PERSIST_ENV",
    "EVENTS_DIR_ENV",
    "EagerMode",
    "EAGER_MODES",
    "apply_env",
    "eager_mode_env",
    "eager_mode_from_env",
    "recorded_env",
    "single_host_topology",
    "xla_flag",
    "tpu_launch_env",
]


@dataclass(frozen=True)
class EagerMode:
    """One ``--eager-mode`` choice: its CLI spelling, TorchTPU's enum member, and the variable that selects it."""

    cli_name: str
    enum_name: str
    doc_name: str
    env_var: str | None  # None: TorchTPU's default (Strict), selected by leaving both switches unset

    def env_updates(self) -> dict[str, str | None]:
        """Variables to set (str) or remove (None) so that TorchTPU starts in this mode."""
        updates: dict[str, str | None] = {LAUNCH_BLOCKING_ENV: None, DEFER_AND_FUSE_ENV: None}
        updates.update({name: None for name in LEGACY_EAGER_ENVS})
        if self.env_var is not None:
            updates[self.env_var] = "1"
        return updates


EAGER_MODES: dict[str, EagerMode] = {
    mode.cli_name: mode
    for mode in (
        EagerMode("strict", "DEFER_NEVER", "Strict Eager", None),
        EagerMode("debug", "DEFER_NEVER_AND_LAUNCH_BLOCKING", "Debug Eager", LAUNCH_BLOCKING_ENV),
        EagerMode("defer-and-fuse", "DEFER_AND_FUSE", "Fused Eager", DEFER_AND_FUSE_ENV),
    )
}


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in {"1", "true", "yes", "on"}


def eager_mode_env(cli_name: str) -> dict[str, str | None]:
    """The env edits for ``--eager-mode NAME`` (``KeyError`` for unknown names; the CLI restricts choices)."""
    return EAGER_MODES[cli_name].env_updates()


def eager_mode_from_env(env: Mapping[str, str]) -> tuple[EagerMode, str]:
    """The eager mode TorchTPU would start in under ``env``, and which variable decided it.

    Launch blocking wins over defer-and-fuse when both are set, as ``CUDA_LAUNCH_BLOCKING`` wins over any
    asynchrony: it is the switch people set while debugging, and silently ignoring it would hide their bug.
    """
    for name in (LAUNCH_BLOCKING_ENV, "TPU_LAUNCH_BLOCKING"):
        if _truthy(env.get(name)):
            return EAGER_MODES["debug"], f"{name}={env[name]}"
    for name in (DEFER_AND_FUSE_ENV, "TPU_DEFER_AND_FUSE"):
        if _truthy(env.get(name)):
            return EAGER_MODES["defer-and-fuse"], f"{name}={env[name]}"
    return EAGER_MODES["strict"], "default (neither TORCH_TPU_LAUNCH_BLOCKING nor TORCH_TPU_DEFER_AND_FUSE is set)"


def recorded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The TorchTPU / XLA / libtpu / tpu-agent variables in ``env``, sorted by name."""
    return {k: env[k] for k in sorted(env) if k.startswith(RECORDED_PREFIXES)}


def xla_flag(flags: str | None, name: str) -> str | None:
    """The value ``XLA_FLAGS`` (``flags``) gives ``--name`` (the last mention wins; ``""`` for a bare flag), None
    when it is not mentioned. Flags are split as a shell would; an unbalanced quote (``--xla_dump_to=/tmp/bob's``)
    falls back to whitespace, so one apostrophe cannot stop a rank at start-up."""
    try:
        tokens = shlex.split(flags or "")
    except ValueError:
        tokens = (flags or "").split()
    value = None
    for token in tokens:
        flag, _, given = token.partition("=")
        if flag == name:
            value = given
    return value


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def single_host_topology(chip: Chip, nproc: int) -> str:
    """``TORCH_TPU_TOPOLOGY`` for ``nproc`` local processes, one device each (reference §1.2 table).

    Counts absent from TorchTPU's table (e.g. two v6e chips) get the same x,y,z shape rule the table
    follows for two chips of other generations: a 1 x N x 1 line.
    """
    chips = max(1, -(-nproc // chip.devices_per_chip))
    known = chip.single_host_topology.get(chips)
    if known is not None:
        return known
    shape = f"1,{chips},1"
    return f"{shape},{chip.devices_per_chip}" if chip.devices_per_chip > 1 else shape


def tpu_launch_env(chip: Chip, nproc: int, env: Mapping[str, str]) -> dict[str, str]:
    """The three variables TorchTPU needs every rank to agree on (reference §4.2), for one host.

    Mirrors ``torch.tpu.distributed.set_tpu_launch_env`` on a single host: a value already in ``env`` is
    never overwritten, so a user (or a cluster scheduler) who exported them keeps theirs.
    """
    wanted = {
        "TORCH_TPU_TOPOLOGY": lambda: single_host_topology(chip, nproc),
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": lambda: ",".join(f"localhost:{_free_port()}" for _ in range(nproc)),
        "TORCH_TPU_XPROF_SESSION_ID": lambda: str(time.time_ns()),
    }
    return {name: make() for name, make in wanted.items() if name not in env}


def apply_env(updates: Mapping[str, str | None], env: dict[str, str] | None = None) -> dict[str, str]:
    """Apply set (str) / remove (None) edits to ``env`` (default: a copy of ``os.environ``) and return it."""
    result = dict(os.environ) if env is None else env
    for name, value in updates.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = value
    return result
