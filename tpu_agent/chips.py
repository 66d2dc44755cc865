"""TPU generations: the one table read by the runtime's device properties and the profiler's estimates.

Values for name, HBM and peak bf16 FLOP/s come from TorchTPU 0.2.0's ``torch_tpu/_internal/utils/hardware.py``
and agree with Google's pages (v4 275 TFLOP/s, 32 GiB, 1,200 GB/s; v5e 197, 16 GB, 819 GB/s; v5p 459, 95 GiB,
2,765 GB/s; v6e 918, 32 GB, 1,638 GB/s; TPU7x 2,307, 192 GiB). Where a page writes "GB" of HBM the chip holds
GiB (libtpu offers 15.75 GiB of a v5e's 16 GiB to programs), as TorchTPU's ``total_memory`` reports it.
HBM and inter-chip (ICI) bandwidth, MXU tile and TensorCores per chip come from Google's public Cloud TPU
system-architecture pages (https://cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e, /tpu7x; ICI is published in
Gbit/s per chip and stored here in bytes/s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tpu_agent.errors import TpuAgentError

GIB = 1024**3

# A slice's physical layout by chip count, in libtpu's spelling (a v5e-8 is a 2x4 grid of chips): what the
# deviceless compiler is given as "<generation>:<grid>" (tpu_agent.estimate.compiler). The single-host ones are
# the layouts TorchTPU's TORCH_TPU_TOPOLOGY writes with commas (Chip.single_host_topology: 8 -> "2,4,1").
_GRIDS_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_GRIDS_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8"}


@dataclass(frozen=True)
class Chip:
    """One TPU generation as user code and performance estimates see it."""

    key: str  # CLI spelling: v5e, v5p, v6e, v7
    device_name: str  # what torch.tpu.get_device_name() returns
    pci_device_id: int
    hbm_bytes_per_chip: int
    devices_per_chip: int  # TorchTPU devices (processes) one chip exposes
    peak_bf16_flops_per_chip: float
    hbm_bandwidth_bytes_per_s: float
    ici_bandwidth_bytes_per_s: float  # inter-chip interconnect, per chip: what bounds a slice's collectives
    mxu_tile: int  # systolic array edge: matmul dims are padded to multiples of it
    single_host_topology: dict[int, str]  # local chip count -> TORCH_TPU_TOPOLOGY value
    # chip count -> libtpu's grid for a slice of that many chips; empty: estimates do not lay this generation out
    slice_grids: dict[int, str] = field(default_factory=dict)

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.hbm_bytes_per_chip // self.devices_per_chip

    @property
    def peak_bf16_flops_per_device(self) -> float:
        return self.peak_bf16_flops_per_chip / self.devices_per_chip

    @property
    def hbm_bandwidth_per_device(self) -> float:
        return self.hbm_bandwidth_bytes_per_s / self.devices_per_chip


CHIPS: dict[str, Chip] = {
    chip.key: chip
    for chip in (
        Chip(
            key="v4",
            device_name="TPU v4",
            pci_device_id=0x005E,
            hbm_bytes_per_chip=32 * GIB,
            devices_per_chip=1,
            peak_bf16_flops_per_chip=275e12,
            hbm_bandwidth_bytes_per_s=1.2e12,
            ici_bandwidth_bytes_per_s=2400e9 / 8,
            mxu_tile=128,
            single_host_topology={1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"},
        ),
        Chip(
            key="v5e",
            device_name="TPU v5e",
            pci_device_id=0x0063,
            hbm_bytes_per_chip=16 * GIB,
            devices_per_chip=1,
            peak_bf16_flops_per_chip=197e12,
            hbm_bandwidth_bytes_per_s=819e9,
            ici_bandwidth_bytes_per_s=1600e9 / 8,
            mxu_tile=128,
            single_host_topology={1: "1,1,1", 4: "2,2,1", 8: "2,4,1"},
            slice_grids=_GRIDS_2D,
        ),
        Chip(
            key="v5p",
            device_name="TPU v5p",
            pci_device_id=0x0062,
            hbm_bytes_per_chip=95 * GIB,
            devices_per_chip=1,
            peak_bf16_flops_per_chip=459e12,
            hbm_bandwidth_bytes_per_s=2.765e12,
            ici_bandwidth_bytes_per_s=4800e9 / 8,
            mxu_tile=128,
            single_host_topology={1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"},
            slice_grids=_GRIDS_3D,
        ),
        Chip(
            key="v6e",
            device_name="TPU v6e",
            pci_device_id=0x006F,
            hbm_bytes_per_chip=32 * GIB,
            devices_per_chip=1,
            peak_bf16_flops_per_chip=918e12,
            hbm_bandwidth_bytes_per_s=1638e9,
            ici_bandwidth_bytes_per_s=3584e9 / 8,
            mxu_tile=256,
            single_host_topology={1: "1,1,1", 4: "2,2,1", 8: "2,4,1"},
            slice_grids=_GRIDS_2D,
        ),
        Chip(
            key="v7",
            device_name="TPU v7",
            pci_device_id=0x0076,
            hbm_bytes_per_chip=192 * GIB,
            devices_per_chip=2,
            peak_bf16_flops_per_chip=2307e12,
            hbm_bandwidth_bytes_per_s=7.37e12,
            ici_bandwidth_bytes_per_s=9600e9 / 8,
            mxu_tile=256,
            single_host_topology={2: "1,1,1,2", 4: "1,2,1,2", 8: "2,2,1,2"},
        ),
    )
}

DEFAULT_CHIP = "v6e"
CLI_CHIPS = ("v4", "v5e", "v5p", "v6e", "v7")
SLICE_GENERATIONS = tuple(key for key, chip in CHIPS.items() if chip.slice_grids)  # the ones estimates lay out
TARGET_EXAMPLES = "a generation (v5e, v6e, v5p, v4, v7: one chip) or a slice (v5e-8, v6e-4, v5p-16)"


@dataclass(frozen=True)
class TpuTarget:
    """What ``--chip`` names: a TPU generation and how many chips of it (``v5e`` is one chip, ``v5e-8`` eight).

    The emulated host shows ``min(chips, the largest single-host topology)`` devices, as a TorchTPU host of that
    slice would; estimates use ``chips`` whole.
    """

    chip: Chip
    chips: int = 1

    @property
    def spec(self) -> str:
        """The canonical spelling (``v5e`` or ``v5e-8``), as accepted by :func:`parse_target`."""
        return self.chip.key if self.chips == 1 else f"{self.chip.key}-{self.chips}"

    @property
    def chips_per_host(self) -> int:
        """Chips one host of this slice holds: the largest single-host topology not above ``chips``."""
        fitting = [count for count in self.chip.single_host_topology if count <= self.chips]
        return max(fitting) if fitting else min(self.chip.single_host_topology)

    @property
    def devices_per_host(self) -> int:
        """TorchTPU devices (one process each) that one host of this slice exposes."""
        return self.chips_per_host * self.chip.devices_per_chip


def host_devices(target: TpuTarget, nproc: int) -> int:
    """Devices the host of a run shows (``torch.accelerator.device_count()`` in every rank), for ``nproc`` ranks.

    A slice (``v6e-4``) fixes the host: one host of it, and at most that many ranks. A generation alone
    (``v6e``) names no host size, so the host is the smallest single-host topology that holds ``nproc`` ranks
    (two ranks on v6e: a 4-chip host), up to the largest one host can have. More ranks than the host has
    devices is refused: TorchTPU binds one device per process. Raises TpuAgentError.
    """
    per_chip = target.chip.devices_per_chip
    sizes = sorted(count * per_chip for count in target.chip.single_host_topology)
    capacity = target.devices_per_host if target.chips > 1 else sizes[-1]
    if nproc > capacity:
        what = f"one {target.spec} host has" if target.chips > 1 else f"the largest {target.chip.key} host has"
        raise TpuAgentError(
            code="too-many-ranks",
            message=f"--nproc {nproc}: {what} {capacity} TPU devices, and TorchTPU runs one process per device",
            hint=f"use --nproc {capacity} or fewer on one host; for more ranks run several hosts with --nnodes "
            "(each with its own --node-rank and a shared --rdzv-endpoint)",
        )
    if target.chips > 1:
        return target.devices_per_host
    return next(size for size in sizes if size >= nproc) if nproc > 1 else max(per_chip, 1)


def process_counts(target: TpuTarget) -> list[int]:
    """The process counts one TorchTPU host of ``target`` runs: one (bound to one of the host's devices), or one
    per device of a single-host topology that fits the host. TorchTPU derives ``TORCH_TPU_TOPOLOGY`` from the
    local process count, and a count with no topology in the chip's table (two on v6e) fails at start-up."""
    per_chip = target.chip.devices_per_chip
    sizes = {count * per_chip for count in target.chip.single_host_topology}
    capacity = target.devices_per_host if target.chips > 1 else max(sizes)
    return sorted({1} | {size for size in sizes if size <= capacity})


def check_process_count(target: TpuTarget, nproc: int) -> None:
    """Refuse ``nproc`` ranks on one host of a chip named by the user when a TorchTPU host of it runs no such
    count (the emulation itself runs any count up to the host's devices: :func:`host_devices` checks that first).
    Raises TpuAgentError."""
    host_devices(target, nproc)
    counts = process_counts(target)
    if nproc not in counts:
        spelled = ", ".join(str(count) for count in counts[:-1]) + f" or {counts[-1]}"
        raise TpuAgentError(
            code="unsupported-process-count",
            message=f"--nproc {nproc} --chip {target.spec}: a TorchTPU {target.spec} host runs {spelled} processes "
            f"(one per device of a single-host topology), not {nproc}",
            hint=f"use --nproc {spelled}; without --chip the emulation runs any count up to the host's devices, "
            "which a real host refuses",
        )


def _unknown_chip(spec: str) -> TpuAgentError:
    return TpuAgentError(
        code="unknown-chip",
        message=f"unknown TPU chip {spec!r}",
        hint=f"use {TARGET_EXAMPLES}; generations: {', '.join(CLI_CHIPS)}",
    )


def parse_target(spec: str) -> TpuTarget:
    """Parse ``--chip``: ``v5e`` (one chip) or ``v5e-8`` (a slice of 8); unknown names are refused with the list."""
    match = re.fullmatch(r"\s*(v\d+[a-z]*)(?:-(\d+))?\s*", spec.lower())
    if match is None or match.group(1) not in CHIPS:
        raise _unknown_chip(spec)
    chips = int(match.group(2) or 1)
    if chips < 1 or chips > 8960:
        raise TpuAgentError(
            code="unknown-chip",
            message=f"--chip {spec!r}: a slice has 1 to 8960 chips",
            hint=f"use {TARGET_EXAMPLES}",
        )
    return TpuTarget(CHIPS[match.group(1)], chips)


def get_chip(spec: str) -> Chip:
    """The generation a ``--chip`` spelling names (``v5e`` and ``v5e-8`` both give v5e); unknown ones are refused."""
    return parse_target(spec).chip
