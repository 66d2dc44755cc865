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

# Variables worth recording with a run (RunInfo) and showing in doctor.
RECORDED_PREFIXES = ("TORCH_TPU_", "TPU_", "XLA_", "LIBTPU_", "TPU_AGENT_", "PJRT_")

__all__ = [
    "BACKEND_ENV",
    "CHIP_ENV",
    "HOOKS_ENV",
    "TIER2_CACHE_ENV",
    "XLA_PERSIST_ENV",
    "DEBUG_CHECKS",
    "DEBUG_EAGER",
    "DEFER_AND_FUSE",
    "EVENTS_DIR_ENV",
    "EAGER_MODES",
    "FUSED_EAGER",
    "LAUNCH_BLOCKING",
    "EagerModeOption",
    "EnvSwitch",
    "apply_env",
    "debug_checks_from_env",
    "eager_mode_env",
    "eager_mode_from_env",
    "is_true",
    "recorded_env",
    "single_host_topology",
    "xla_flag",
    "tpu_launch_env",
]


_TRUE = frozenset({"1", "true", "yes", "on"})


def is_true(value: str) -> bool:
    """Whether a switch's value turns it on: ``1``, ``true``, ``yes`` or ``on`` in any case; anything else (``0``,
    ``false``, an empty string) turns it off. TorchTPU documents ``=1`` (the reference does not record which other
    spellings its C++ reader takes); the spellings people type for a boolean in a shell are read as meant, so
    ``TORCH_TPU_LAUNCH_BLOCKING=true`` never silently means Strict Eager here."""
    return value.strip().lower() in _TRUE


@dataclass(frozen=True)
class EnvSwitch:
    """One of TorchTPU's on/off variables and the older spelling that builds before 0.2.0 read (reference §8.1)."""

    name: str
    legacy: str

    def setting(self, env: Mapping[str, str]) -> tuple[str, str] | None:
        """The variable that decides this switch in ``env`` and its value; None when neither spelling is set.

        The current name decides whenever it is set, even to ``0``; the legacy one only when the current one is
        absent. That is TorchTPU's own order (reference §2.2: "``TORCH_TPU_…`` wins if both are set"), and it
        keeps a stale legacy export in someone's shell from overriding the flag they set today.
        """
        for name in (self.name, self.legacy):
            if name in env:
                return name, env[name]
        return None

    def is_on(self, env: Mapping[str, str]) -> bool | None:
        """On or off as ``env`` sets it (:func:`is_true` of the deciding value); None when it is not set."""
        decided = self.setting(env)
        return None if decided is None else is_true(decided[1])

    def on_source(self, env: Mapping[str, str]) -> str | None:
        """``NAME=value`` of the variable that turns this switch on in ``env``; None when it is off or unset."""
        decided = self.setting(env)
        return f"{decided[0]}={decided[1]}" if decided is not None and is_true(decided[1]) else None


LAUNCH_BLOCKING = EnvSwitch("TORCH_TPU_LAUNCH_BLOCKING", "TPU_LAUNCH_BLOCKING")
DEFER_AND_FUSE = EnvSwitch("TORCH_TPU_DEFER_AND_FUSE", "TPU_DEFER_AND_FUSE")
DEBUG_CHECKS = EnvSwitch("TORCH_TPU_ENABLE_DEBUG_CHECKS", "TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS")


@dataclass(frozen=True)
class EagerModeOption:
    """One ``--eager-mode`` choice: its CLI spelling, the name of TorchTPU's ``EagerMode`` member (the emulation's
    enum is :class:`tpu_agent.runtime.emulated.state.EagerMode`), its doc name, and the switch that selects it."""

    cli_name: str
    enum_name: str
    doc_name: str
    switch: EnvSwitch | None  # None: TorchTPU's default (Strict), selected by leaving both switches off

    def env_updates(self) -> dict[str, str | None]:
        """Variables to set (str) or remove (None) so that TorchTPU starts in this mode: every spelling of both
        switches is removed first, so a stale one in the user's shell cannot override the choice."""
        updates: dict[str, str | None] = {
            name: None for switch in (LAUNCH_BLOCKING, DEFER_AND_FUSE) for name in (switch.name, switch.legacy)
        }
        if self.switch is not None:
            updates[self.switch.name] = "1"
        return updates


EAGER_MODES: dict[str, EagerModeOption] = {
    mode.cli_name: mode
    for mode in (
        EagerModeOption("strict", "DEFER_NEVER", "Strict Eager", None),
        EagerModeOption("debug", "DEFER_NEVER_AND_LAUNCH_BLOCKING", "Debug Eager", LAUNCH_BLOCKING),
        EagerModeOption("defer-and-fuse", "DEFER_AND_FUSE", "Fused Eager", DEFER_AND_FUSE),
    )
}
DEBUG_EAGER = EAGER_MODES["debug"]
FUSED_EAGER = EAGER_MODES["defer-and-fuse"]


def eager_mode_env(cli_name: str) -> dict[str, str | None]:
    """The env edits for ``--eager-mode NAME`` (``KeyError`` for unknown names; the CLI restricts choices)."""
    return EAGER_MODES[cli_name].env_updates()


def eager_mode_from_env(env: Mapping[str, str]) -> tuple[EagerModeOption, str]:
    """The eager mode TorchTPU would start in under ``env``, and which variable decided it (``NAME=value``).

    The one reader of the eager-mode variables: ``tpu-agent run``, ``doctor``, the emulation's activation and
    the profile's capture rule all ask here. Each switch is read as :meth:`EnvSwitch.setting` says (the current
    name wins over the legacy one). Launch blocking wins over defer-and-fuse when both are on, as
    ``CUDA_LAUNCH_BLOCKING`` wins over any asynchrony: it is the switch people set while debugging, and silently
    ignoring it would hide their bug.
    """
    for mode in (DEBUG_EAGER, FUSED_EAGER):  # launch blocking first
        source = mode.switch.on_source(env) if mode.switch is not None else None
        if source is not None:
            return mode, source
    return EAGER_MODES["strict"], f"default (neither {LAUNCH_BLOCKING.name} nor {DEFER_AND_FUSE.name} is on)"


def debug_checks_from_env(env: Mapping[str, str], launch_blocking: bool) -> bool:
    """Whether TorchTPU's debug checks run: Debug Eager (``launch_blocking``) turns them on, and
    ``TORCH_TPU_ENABLE_DEBUG_CHECKS`` set either way overrides the mode (reference §8.1)."""
    on = DEBUG_CHECKS.is_on(env)
    return launch_blocking if on is None else on


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
