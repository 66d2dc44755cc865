"""``tpu-agent doctor``: what this host would run a script on, and why, without running anything.

Versions come from installed distribution metadata and the device from the same PCI scan the backend
selection uses, so nothing here imports torch or torch_tpu (which on a TPU host would claim the device).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Any

from tpu_agent.chips import DEFAULT_CHIP, get_chip
from tpu_agent.runtime.envvars import CHIP_ENV, eager_mode_from_env, recorded_env
from tpu_agent.runtime.select import (
    BackendChoice,
    package_version,
    scan_tpu_devices,
    select_backend,
    torch_tpu_importable,
)
from tpu_agent.runtime.tpu_compiler import compiler_status
from tpu_agent.runtime.xla import settings

NOT_INSTALLED = "not installed"
REPORTED_PACKAGES = ("torch", "torch_tpu", "libtpu", "jax", "jaxlib")
#: The torch_tpu release whose Python surface the emulation's face follows (docs/torchtpu-fidelity.md)
SURFACE_FOLLOWS = "0.2.0"
#: The newest torch_tpu release PyPI lists, and the guide rendered for it
NEWEST_RELEASE = "0.3.0"
GUIDE_URL = "https://torchtpu.readthedocs.io"
LEGACY_APIS_ENV = "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS"
AUTOLOAD_ENTRY_POINT = "tpu_agent.runtime.autoload:load"


@dataclass(frozen=True)
class DoctorReport:
    """Versions, the backend ``auto`` would pick (and why), the chip, the eager mode and the TPU env."""

    python: str
    versions: dict[str, str]
    backend: BackendChoice
    tpu_devices: list[str]
    chip: str
    chip_source: str
    eager_mode: str
    eager_mode_doc_name: str
    eager_mode_source: str
    env: dict[str, str] = field(default_factory=dict)
    tpu_compiler: dict[str, Any] = field(default_factory=dict)  # libtpu for `tpu-agent estimate` (compiler_status)
    graph_compiler: dict[str, str] = field(default_factory=dict)  # the emulation's: name and why (settings.describe)
    torch_tpu_surface: dict[str, str] = field(default_factory=dict)  # what `import torch_tpu` gives a run, autoload

    def to_dict(self) -> dict[str, Any]:
        return {
            "python": self.python,
            "versions": dict(self.versions),
            "backend": self.backend.to_dict(),
            "tpu_devices": list(self.tpu_devices),
            "chip": self.chip,
            "chip_source": self.chip_source,
            "eager_mode": {
                "name": self.eager_mode,
                "doc_name": self.eager_mode_doc_name,
                "source": self.eager_mode_source,
            },
            "env": dict(self.env),
            "tpu_compiler": dict(self.tpu_compiler),
            "graph_compiler": dict(self.graph_compiler),
            "torch_tpu_surface": dict(self.torch_tpu_surface),
        }


def torch_tpu_surface() -> dict[str, str]:
    """What ``import torch_tpu`` finds in a run, how it stands to the newest release and guide, what the legacy
    ``torch.tpu`` device calls do in this environment, and whether the device reaches the processes a script starts.

    The second depends on the ``torch.backends`` entry point being installed: an editable install made before it
    was declared lacks it until ``pip install -e .`` runs again."""
    import importlib.metadata

    installed = package_version("torch_tpu")
    if installed is not None and torch_tpu_importable():
        provides = f"the real torch_tpu {installed}"
    else:
        provides = f"the emulation's face of torch_tpu (follows torch_tpu {SURFACE_FOLLOWS}; docs/torchtpu-fidelity.md)"
    points = importlib.metadata.entry_points(group="torch.backends")
    if any(point.value == AUTOLOAD_ENTRY_POINT for point in points):
        autoload = "installed: every process a run starts (python children, torchrun workers) gets the tpu device"
    else:
        autoload = (
            "missing: only the ranks get the tpu device, not the processes they start; reinstall tpu-agent "
            "(pip install -e . in a checkout) to register its torch.backends entry point"
        )
    newest = (
        f"torch_tpu {NEWEST_RELEASE} on PyPI, guide {GUIDE_URL}; the face also runs the guide's forms the "
        f"{SURFACE_FOLLOWS} wheel refuses (`with em.eager_mode(X):`, torch.backends.tpu.allow_excess_precision)"
    )
    if os.environ.get(LEGACY_APIS_ENV) == "1":
        legacy = f"warn once ({LEGACY_APIS_ENV}=1): torch.tpu.is_available & co. run; prefer torch.accelerator.*"
    else:
        legacy = (
            "raise RuntimeError from user code: torch.tpu.is_available, device_count, current_device, set_device, "
            f"synchronize, current_stream, set_stream are internal with torch >= 2.11; use torch.accelerator.* "
            f"({LEGACY_APIS_ENV}=1 makes them warn)"
        )
    return {"import_torch_tpu": provides, "newest": newest, "legacy_device_apis": legacy, "autoload": autoload}


def doctor() -> DoctorReport:
    """Inspect this host and environment (``TPU_AGENT_CHIP``, ``TORCH_TPU_*``) without side effects."""
    versions = {name: package_version(name) or NOT_INSTALLED for name in REPORTED_PACKAGES}
    choice = select_backend("auto")
    devices = scan_tpu_devices()
    if choice.name == "torch_tpu" and devices:
        chip, chip_source = (
            devices[0].chip.key,
            f"detected {devices[0].chip.device_name} at PCI {devices[0].pci_address}",
        )
    elif CHIP_ENV in os.environ:
        chip, chip_source = get_chip(os.environ[CHIP_ENV]).key, f"{CHIP_ENV}={os.environ[CHIP_ENV]}"
    else:
        chip, chip_source = DEFAULT_CHIP, "default for the emulation (change with --chip)"
    mode, mode_source = eager_mode_from_env(os.environ)
    return DoctorReport(
        python=platform.python_version(),
        versions=versions,
        backend=choice,
        tpu_devices=[f"{d.chip.device_name} ({d.pci_address}, {d.vfio_path})" for d in devices],
        chip=chip,
        chip_source=chip_source,
        eager_mode=mode.enum_name,
        eager_mode_doc_name=mode.doc_name,
        eager_mode_source=mode_source,
        env=recorded_env(os.environ),
        tpu_compiler=compiler_status().to_dict(),
        graph_compiler=dict(zip(("name", "source"), settings.describe(), strict=True)),
        torch_tpu_surface=torch_tpu_surface(),
    )
