"""Debug Eager (TORCH_TPU_LAUNCH_BLOCKING=1): the op that creates NaN is named with the user line."""

import json

import torch

from tpu_agent.runtime.emulated import activate

activate()
x = torch.tensor([1.0, -1.0]).to("tpu")
masked = torch.zeros(2).to("tpu").masked_fill(torch.tensor([True, False]).to("tpu"), float("-inf"))
try:
    y = torch.log(x)  # LINE nan
    error = None
except RuntimeError as e:
    error = str(e)
print(json.dumps({"mode": torch.tpu.eager_mode.name, "error": error, "masked_ok": masked.isinf().any().item()}))
