"""Choose the backend a run uses: the real ``torch_tpu`` wheel on a TPU host, the CPU emulation elsewhere.

The choice is made in the launcher, before any rank starts, without importing torch or torch_tpu: importing
torch_tpu on a TPU host initialises the device in the launcher process (and one TPU can only belong to one
process), and importing torch costs seconds the CLI should not pay. So the device check replicates what
torch_tpu 0.2.0 itself does (``_internal/utils/hardware.get_tpu_device_count``, reference §1.1): count PCI
devices of vendor 0x1ae0 with a known TPU device id that are exposed through VFIO. When that count is zero,
torch_tpu's autoload registers no device either, so the emulation is the only way the script can run.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from tpu_agent.chips import CHIPS, Chip
from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.runtime.run_scope import SURFACE_DIR

BACKENDS = ("auto", "torch_tpu", "emulated")
TPU_PCI_VENDOR = 0x1AE0


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run will use (``"torch_tpu"`` or ``"emulated"``) and the sentence saying why."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class TpuDevice:
    """One TPU PCI function found on this host."""

    pci_address: str
    chip: Chip
    vfio_path: str


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` from its metadata (nothing is imported), or ``None``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_tpu_importable() -> bool:
    """Whether ``import torch_tpu`` would find the real package (the top-level spec only; nothing runs).

    The emulation's own face of torch_tpu (on ``PYTHONPATH`` inside a run, so also in a run started from a run)
    is not the real package.
    """
    spec = importlib.util.find_spec("torch_tpu")
    return spec is not None and not (spec.origin or "").startswith(str(SURFACE_DIR) + os.sep)


def scan_tpu_devices(root: Path = Path("/")) -> list[TpuDevice]:
    """TPU devices usable through VFIO, found the way torch_tpu 0.2.0 finds them.

    ``root`` is the filesystem root holding ``sys/bus/pci/devices`` and ``dev/vfio``; tests point it at a
    directory tree shaped like sysfs.
    """
    by_pci_id = {chip.pci_device_id: chip for chip in CHIPS.values()}
    devices_dir = root / "sys" / "bus" / "pci" / "devices"
    found: list[TpuDevice] = []
    try:
        entries = sorted(devices_dir.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            vendor = int((entry / "vendor").read_text().strip(), 16)
            device_id = int((entry / "device").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if vendor != TPU_PCI_VENDOR or device_id not in by_pci_id:
            continue
        try:
            group = os.path.basename(os.readlink(entry / "iommu_group"))
        except OSError:
            continue
        vfio = root / "dev" / "vfio" / group
        if vfio.exists():
            found.append(TpuDevice(pci_address=entry.name, chip=by_pci_id[device_id], vfio_path=str(vfio)))
    return found


def select_backend(requested: str = "auto", root: Path = Path("/")) -> BackendChoice:
    """Resolve ``--backend``: ``auto`` takes real torch_tpu when it is importable and sees a TPU.

    Raises :class:`TpuAgentError` for an unknown name, and when ``torch_tpu`` is requested explicitly but
    cannot run here (not installed, or no TPU device), because the script would then fail on its first
    ``"tpu"`` tensor with a less helpful error.
    """
    if requested not in BACKENDS:
        raise TpuAgentError(
            code="unknown-backend",
            message=f"unknown backend {requested!r} (--backend)",
            hint=f"use one of: {', '.join(BACKENDS)}",
        )
    if requested == "emulated":
        return BackendChoice("emulated", "requested with --backend emulated")
    version = package_version("torch_tpu") if torch_tpu_importable() else None
    devices = scan_tpu_devices(root)
    if version is not None and devices:
        chips = sorted({d.chip.device_name for d in devices})
        return BackendChoice(
            "torch_tpu",
            f"torch_tpu {version} is installed and {len(devices)} TPU device(s) are visible ({', '.join(chips)})",
        )
    if version is None:
        why = "torch_tpu is not installed"
        hint = "pip install torch_tpu (on a TPU VM), or use --backend emulated"
    else:
        why = (
            f"torch_tpu {version} is installed but no TPU device is visible (no PCI device of vendor "
            f"{TPU_PCI_VENDOR:#06x} exposed through /dev/vfio), so torch_tpu would register no 'tpu' device"
        )
        hint = "run on a TPU VM, or use --backend emulated"
    if requested == "torch_tpu":
        raise TpuAgentError(
            code="torch-tpu-unavailable",
            message=f"--backend torch_tpu cannot run here: {why}",
            hint=hint,
            exit_code=ExitCode.REFUSED,
        )
    return BackendChoice("emulated", f"{why}; using the CPU emulation of the 'tpu' device")
