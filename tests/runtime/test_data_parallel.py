"""``torch.nn.DataParallel`` on the tpu device. A TorchTPU process holds one chip, so DataParallel sees one device
and runs the module there as torch does with one GPU (torch's scatter is a CUDA op); asking for more devices is
refused with the fix (DDP over ``tpu_dist``, migrate rule TPU406). ``DistributedDataParallel`` tracking unused
parameters on tpu is refused when it is built, with the way around it, not at its first backward."""

from __future__ import annotations

from pathlib import Path

from runtime_launch_util import run_script

SCRIPT = r"""
import json, warnings
import torch
from tpu_agent.runtime.emulated import activate

warnings.simplefilter("ignore")
activate()
torch.set_float32_matmul_precision("highest")
torch.manual_seed(0)
linear, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
expected = linear(x)
model = torch.nn.DataParallel(linear)
y = model(x)  # a CPU input goes to the device, as torch's scatter copies it to device_ids[0]
y.sum().backward()
out = {
    "device_ids": model.device_ids,
    "devices": [str(y.device), str(linear.weight.device), str(linear.weight.grad.device)],
    "max_diff": (y.cpu() - expected).abs().max().item(),
}
try:
    torch.nn.DataParallel(torch.nn.Linear(3, 2).to("tpu"), device_ids=[0, 1])(x)
except RuntimeError as error:
    out["refused"] = str(error)
DDP = torch.nn.parallel.DistributedDataParallel
for label, make in [
    ("unused", lambda m: DDP(m, find_unused_parameters=True)),
    ("static", lambda m: DDP(m, None, None, 0, True, True, None, None, False, False, False, True)),  # positional
    ("cpu", lambda m: DDP(m.cpu(), find_unused_parameters=True)),
]:
    try:
        make(torch.nn.Linear(3, 2).to("tpu"))
    except (RuntimeError, ValueError) as error:
        out[label] = str(error)
print(json.dumps(out))
"""


def test_data_parallel_runs_on_the_one_tpu_device_and_refuses_several(tmp_path: Path) -> None:
    out = run_script(SCRIPT, tmp_path)
    assert out["device_ids"] == [0]
    assert out["devices"] == ["tpu:0"] * 3
    assert out["max_diff"] < 1e-6
    assert "DataParallel over tpu devices [0, 1]" in out["refused"]
    assert "DistributedDataParallel" in out["refused"] and "TPU406" in out["refused"]
    assert out["unused"].startswith("DistributedDataParallel(find_unused_parameters=True) over tpu parameters")
    assert "drop find_unused_parameters" in out["unused"]
    assert out["static"].startswith("DistributedDataParallel(static_graph=True) over tpu parameters")
    assert "not emulated" not in out["cpu"]  # CPU parameters reach torch (which wants a process group here)
