"""``torch.nn.DataParallel`` on the tpu device. A TorchTPU process holds one chip, so DataParallel sees one device
and runs the module there as torch does with one GPU (torch's scatter is a CUDA op); asking for more devices is
refused with the fix (DDP over ``tpu_dist``, migrate rule TPU406). ``DistributedDataParallel`` tracking unused
parameters on tpu is refused when it is built, with the way around it, not at its first backward. A tensor placed on
``tpu:N`` (N > 0, a rank-indexed device written for CUDA) lands on the process's device with a warning at its line."""

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


PLACEMENT = r"""
import json, warnings
import torch
from tpu_agent.runtime.emulated import activate

activate()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    a = torch.ones(2, device="tpu:1")
    b = torch.zeros(2, device="tpu:1")
    c = torch.nn.Linear(2, 2).to(torch.device("tpu", 3)).weight
    d = torch.ones(2, device="tpu:0") + torch.ones(2, device="tpu")
said = [(w.filename.endswith("script.py"), w.lineno, str(w.message)) for w in caught if "binds" in str(w.message)]
print(json.dumps({"devices": [str(t.device) for t in (a, b, c, d)], "warnings": said}))
"""


def test_a_rank_indexed_device_lands_on_the_process_device_with_a_warning_at_its_line(tmp_path: Path) -> None:
    out = run_script(PLACEMENT, tmp_path)
    assert out["devices"] == ["tpu:0"] * 4
    (first, second) = out["warnings"]  # once per index: tpu:1 twice is one warning; tpu:0 and tpu none
    assert first[:2] == [True, 9] and "placed on tpu:1" in first[2] and "TPU107" in first[2]
    assert second[:2] == [True, 11] and "placed on tpu:3" in second[2]
