"""What to launch and how: the value types shared by the runtime facade, the launcher and the front ends.

They live apart from :mod:`tpu_agent.runtime.api` so that the launcher can take them without importing the
facade that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpu_agent.chips import DEFAULT_CHIP


@dataclass(frozen=True)
class LaunchTarget:
    """What to run: a script path (``python SCRIPT``) or a module (``python -m MODULE``), with its argv."""

    target: str
    args: list[str] = field(default_factory=list)
    is_module: bool = False

    def python_argv(self) -> list[str]:
        """The arguments after ``python`` that run this target (``["-m", mod, *args]`` or ``[path, *args]``)."""
        return (["-m", self.target] if self.is_module else [self.target]) + list(self.args)


@dataclass
class RunOptions:
    """How to run: ranks, backend, chip, eager mode, rendezvous, extra environment and a time bound.

    ``nnodes``, ``node_rank``, ``rdzv_endpoint``, ``rdzv_backend`` and ``master_port`` mean what they mean
    to torchrun. ``eager_mode`` is ``"strict"``, ``"debug"``, ``"defer-and-fuse"`` or ``None`` (leave the
    TorchTPU variables as the environment has them). ``timeout_s`` bounds the whole run: when it passes,
    every rank is stopped and :func:`launch` returns 124.
    """

    nproc: int = 1
    backend: str = "auto"
    chip: str = DEFAULT_CHIP
    eager_mode: str | None = None
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    master_port: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    rdzv_backend: str | None = None

    @property
    def multi_process(self) -> bool:
        """Whether the run goes through torchrun's elastic agent (more than one rank, here or elsewhere)."""
        return self.nproc > 1 or self.nnodes != "1" or self.rdzv_endpoint is not None
