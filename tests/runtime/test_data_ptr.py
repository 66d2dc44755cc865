"""``Tensor.data_ptr()`` on a tpu tensor is the address of its data, as on a device: programs compare these to
find shared memory. Every tpu tensor once answered 0, so safetensors' ``save_model`` of a model with tied weights
(an embedding shared with its output layer) found no tensor "covering the entire storage" and refused to save."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_launch_util import run_script

SCRIPT = r"""
import json, sys, torch
from tpu_agent.runtime.api import activate
activate()
from safetensors.torch import load_model, save_model

class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.other = torch.nn.Linear(8, 8)
        self.head.weight = self.embed.weight

torch.manual_seed(0)
model = Tied().to("tpu")
a = torch.randn(4, 3, device="tpu")
b = a + 1  # a pending result under DeferAndFuse: its data is made when its address is asked for
pointers = {
    "distinct": a.data_ptr() != b.data_ptr() and model.other.weight.data_ptr() != model.embed.weight.data_ptr(),
    "tied": model.head.weight.data_ptr() == model.embed.weight.data_ptr(),
    "row_offset": a[1:].data_ptr() - a.data_ptr(),
    "transpose_same": a.t().data_ptr() == a.data_ptr(),
    "storage_start": a.data_ptr() == a.untyped_storage().data_ptr(),
}
save_model(model, sys.argv[1])
copy = Tied()
load_model(copy, sys.argv[1])
pointers["saved"] = all(
    torch.equal(mine.cpu(), theirs) for mine, theirs in zip(model.state_dict().values(), copy.state_dict().values())
)
print(json.dumps(pointers))
"""


@pytest.mark.slow
@pytest.mark.parametrize("defer", ["0", "1"])
def test_data_ptr_is_the_datas_address_and_tied_weights_save(tmp_path: Path, defer: str) -> None:
    out = run_script(SCRIPT, tmp_path, str(tmp_path / "model.safetensors"), TORCH_TPU_DEFER_AND_FUSE=defer)
    assert out == {
        "distinct": True,
        "tied": True,
        "row_offset": 3 * 4,  # one row of 3 float32s
        "transpose_same": True,
        "storage_start": True,
        "saved": True,
    }
