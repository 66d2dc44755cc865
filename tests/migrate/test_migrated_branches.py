"""Migrated programs take the branch their tests meant: the accelerator's on the emulated ``tpu`` device, the
CPU's without an accelerator, and every rank binds its device (QA on karpathy/build-nanogpt and
pytorch/examples' DDP example). The fixtures pin the rewritten text; these run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tpu_agent.migrate.api import apply, plan
from tpu_agent.migrate.model import MigrateOptions

# build-nanogpt's train_gpt2.py: the device string picked at run time, then tested three ways; and membership
# tests in a collection holding "cuda", of the string and of a torch.device's type
DEVICE_TESTS = """\
import torch

device = "cpu"
if torch.cuda.is_available():
    device = "cuda"
device_type = "cuda" if device.startswith("cuda") else "cpu"
use_fused = device_type == "cuda"
pin = "cuda" in device
member = device in ("cuda", "mps") and torch.device(device).type in ["xpu", "cuda"]
host = device_type not in {"cuda"}
x = torch.randn(4, 4, device=device)
with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
    y = x @ x
print("result", device_type, use_fused, pin, member, host, y.dtype)
"""
# pytorch/examples distributed/ddp/example.py binds each rank's device with torch.accelerator only
BIND_RANK = """\
import os

import torch

rank = int(os.environ["LOCAL_RANK"])
torch.accelerator.set_device_index(rank)
print(f"rank {rank} bound {torch.zeros(1, device=torch.accelerator.current_accelerator()).device.type}\\n", end="")
"""
# the same through an alias of torch.cuda.set_device, held by a module global and by an attribute
BIND_RANK_ALIAS = """\
import os

import torch

bind = torch.cuda.set_device


class Setup:
    def __init__(self):
        self.select = torch.cuda.set_device


rank = int(os.environ["LOCAL_RANK"])
bind(rank)
Setup().select(rank)
print(f"rank {rank} bound {torch.zeros(1, device='cuda').device.type}\\n", end="")
"""

# a rank's device built every way training scripts build it (nanoGPT, the DDP tutorials, pytorch/examples'
# minGPT-ddp): TorchTPU binds one device per process, which each rank sees as tpu:0 (a tensor's device says so,
# DEVICE has no index), so none may name index 1
RANK_DEVICES = """\
import os

import torch

local_rank = int(os.environ["LOCAL_RANK"])
acc = torch.accelerator.current_accelerator()
device = f"cuda:{local_rank}"
devices = [
    device,
    torch.device(f"cuda:{local_rank}"),
    torch.device("cuda", local_rank),
    torch.device(f"{acc}:{local_rank}"),
    torch.zeros(1, device="cuda:" + str(local_rank)).device,
    torch.zeros(1).to("cuda:%d" % local_rank).device,
    torch.zeros(1).to(local_rank).device,
    torch.zeros(1).cuda(local_rank).device,
]
print(f"rank {local_rank} devices {sorted({(torch.device(d).type, torch.device(d).index or 0) for d in devices})}\\n", end="")
"""


def _migrated(tmp_path: Path, text: str) -> Path:
    source = tmp_path / "src" / "train.py"
    source.parent.mkdir()
    source.write_text(text)
    result = plan([source.parent], MigrateOptions(jobs=1))
    assert [f.display_path for f in result.changed_files], "the program was not migrated"
    apply(result, output_dir=tmp_path / "out")
    return tmp_path / "out" / "train.py"


def _run(command: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_AGENT_", "TORCH_TPU_"))}
    env.update(extra_env or {})
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_device_string_tests_take_the_accelerator_branch_on_tpu(tmp_path: Path) -> None:
    script = _migrated(tmp_path, DEVICE_TESTS)
    out = _run([sys.executable, "-m", "tpu_agent", "run", "--backend", "emulated", script.name], script.parent)
    assert "result tpu True True True False torch.bfloat16" in out, out


@pytest.mark.skipif(torch.accelerator.is_available(), reason="needs a machine without an accelerator")
def test_device_string_tests_take_the_cpu_branch_without_an_accelerator(tmp_path: Path) -> None:
    script = _migrated(tmp_path, DEVICE_TESTS)
    out = _run([sys.executable, script.name], script.parent)
    assert "result cpu False False False True torch.bfloat16" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("program", [BIND_RANK, BIND_RANK_ALIAS], ids=["accelerator", "cuda-alias"])
def test_every_rank_binds_its_device_on_tpu(tmp_path: Path, program: str) -> None:
    script = _migrated(tmp_path, program)
    command = [sys.executable, "-m", "tpu_agent", "run", "--backend", "emulated", "--nproc", "2", script.name]
    out = _run(command, script.parent)
    assert sorted(line for line in out.splitlines() if line.startswith("rank")) == [
        "rank 0 bound tpu",
        "rank 1 bound tpu",
    ], out


@pytest.mark.slow
def test_every_rank_uses_its_one_device_on_tpu(tmp_path: Path) -> None:
    script = _migrated(tmp_path, RANK_DEVICES)
    command = [sys.executable, "-m", "tpu_agent", "run", "--backend", "emulated", "--nproc", "2", script.name]
    out = _run(command, script.parent)
    assert sorted(line for line in out.splitlines() if line.startswith("rank")) == [
        "rank 0 devices [('tpu', 0)]",
        "rank 1 devices [('tpu', 0)]",
    ], out


@pytest.mark.skipif(torch.accelerator.is_available(), reason="needs a machine without an accelerator")
def test_a_rank_device_is_the_cpu_without_an_accelerator(tmp_path: Path) -> None:
    script = _migrated(tmp_path, RANK_DEVICES)
    out = _run([sys.executable, script.name], script.parent, {"LOCAL_RANK": "1"})
    assert "rank 1 devices [('cpu', 0)]" in out, out
