"""Backend selection: the PCI scan TorchTPU itself uses, and the real torch_tpu 0.2.0 wheel on a host
without a TPU (it is installed, so ``auto`` must say why it still picks the emulation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_launch_util import clean_env, flat, tpu_agent

from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.runtime.select import scan_tpu_devices, select_backend

TORCH_TPU_WHEEL = "torch_tpu==0.2.0"


def _pci_device(root: Path, address: str, vendor: str, device: str, group: str | None, vfio: bool) -> None:
    entry = root / "sys" / "bus" / "pci" / "devices" / address
    entry.mkdir(parents=True)
    (entry / "vendor").write_text(vendor + "\n")
    (entry / "device").write_text(device + "\n")
    if group is not None:
        groups = root / "sys" / "kernel" / "iommu_groups" / group
        groups.mkdir(parents=True, exist_ok=True)
        os.symlink(groups, entry / "iommu_group")
        if vfio:
            (root / "dev" / "vfio").mkdir(parents=True, exist_ok=True)
            (root / "dev" / "vfio" / group).write_text("")


@pytest.fixture
def host_with_tpu(tmp_path: Path) -> Path:
    """A filesystem root shaped like sysfs on a v6e host, plus devices the scan must ignore."""
    _pci_device(tmp_path, "0000:00:05.0", "0x1ae0", "0x006f", "11", vfio=True)  # v6e behind VFIO
    _pci_device(tmp_path, "0000:00:06.0", "0x1ae0", "0x006f", "12", vfio=False)  # not exposed through VFIO
    _pci_device(tmp_path, "0000:00:07.0", "0x1ae0", "0x0001", "13", vfio=True)  # unknown Google device id
    _pci_device(tmp_path, "0000:00:08.0", "0x8086", "0x006f", "14", vfio=True)  # another vendor
    return tmp_path


@pytest.fixture(scope="module")
def torch_tpu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real torch_tpu 0.2.0 wheel, installed without dependencies into a private directory."""
    target = tmp_path_factory.mktemp("torch_tpu")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), TORCH_TPU_WHEEL],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.skip(
            f"could not install {TORCH_TPU_WHEEL} from PyPI here (no network?): {install.stderr.strip()[-300:]}"
        )
    return target


def test_scan_finds_only_known_tpus_exposed_through_vfio(host_with_tpu: Path) -> None:
    devices = scan_tpu_devices(host_with_tpu)
    assert [(d.pci_address, d.chip.key) for d in devices] == [("0000:00:05.0", "v6e")]
    assert devices[0].vfio_path == str(host_with_tpu / "dev" / "vfio" / "11")


def test_this_host_without_torch_tpu_gets_the_emulation_with_a_reason(tmp_path: Path) -> None:
    choice = select_backend("auto", root=tmp_path)
    assert choice.name == "emulated"
    assert "torch_tpu is not installed" in choice.reason
    assert select_backend("emulated").reason == "requested with --backend emulated"


def test_bad_and_impossible_requests_are_refused(host_with_tpu: Path) -> None:
    with pytest.raises(TpuAgentError) as unknown:
        select_backend("cuda")
    assert unknown.value.exit_code == ExitCode.USAGE and "cuda" in unknown.value.message
    with pytest.raises(TpuAgentError) as missing:
        select_backend("torch_tpu", root=host_with_tpu)  # a TPU, but no torch_tpu in this environment
    assert missing.value.exit_code == ExitCode.REFUSED and "torch_tpu is not installed" in missing.value.message


def _select_in_subprocess(torch_tpu_dir: Path, *requests: tuple[str, Path]) -> list[dict[str, str]]:
    """``select_backend`` for each (requested backend, filesystem root), in one process that sees the wheel."""
    code = (
        "import json, sys; from pathlib import Path; from tpu_agent.runtime.select import select_backend; "
        "from tpu_agent.errors import TpuAgentError\n"
        "for requested, root in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    try:\n        print(json.dumps(select_backend(requested, Path(root)).to_dict()))\n"
        "    except TpuAgentError as e:\n        print(json.dumps({'error': e.message, 'exit_code': int(e.exit_code)}))\n"
    )
    arguments = [str(part) for request in requests for part in request]
    result = subprocess.run(
        [sys.executable, "-c", code, *arguments],
        env=clean_env(PYTHONPATH=str(torch_tpu_dir)), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.strip().splitlines()]


@pytest.mark.slow  # installs the wheel from PyPI and launches three interpreters
def test_real_torch_tpu_wheel_without_a_tpu_falls_back_to_the_emulation(
    torch_tpu_dir: Path, tmp_path: Path, host_with_tpu: Path
) -> None:
    fallback, refused, real = _select_in_subprocess(
        torch_tpu_dir,
        ("auto", tmp_path / "empty-root"),
        ("torch_tpu", tmp_path / "empty-root"),
        ("auto", host_with_tpu),  # the same wheel on a host whose sysfs shows a v6e: auto takes the real backend
    )
    assert fallback["name"] == "emulated"
    assert "torch_tpu 0.2.0 is installed but no TPU device is visible" in fallback["reason"]
    assert refused["exit_code"] == ExitCode.REFUSED and "no TPU device is visible" in refused["error"]
    assert real["name"] == "torch_tpu" and "TPU v6e" in real["reason"]

    # end to end: the run says why, keeps the wheel's autoload out of the process (on a host without libtpu
    # it aborts the interpreter), and the script gets the emulated device
    (tmp_path / "probe.py").write_text(
        "import torch\nprint(torch.ones(2, device='tpu').device, 'torch_tpu' in __import__('sys').modules)\n"
    )
    run = tpu_agent("run", "probe.py", cwd=tmp_path, env=clean_env(PYTHONPATH=str(torch_tpu_dir)))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1].split() == ["tpu:0", "False"]
    assert "backend emulated: torch_tpu 0.2.0 is installed but no TPU device is visible" in flat(run.stderr)

    doctor = tpu_agent("doctor", "--format", "json", env=clean_env(PYTHONPATH=str(torch_tpu_dir)))
    assert doctor.returncode == 0, doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["versions"]["torch_tpu"] == "0.2.0"
    assert report["backend"]["name"] == "emulated" and "no TPU device is visible" in report["backend"]["reason"]
