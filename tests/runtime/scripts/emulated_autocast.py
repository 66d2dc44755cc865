"""Output dtypes under torch.autocast("tpu") (TorchTPU's AutocastPrivateUse1 policy)."""

import json

import torch

from tpu_agent.runtime.emulated import activate

activate()
x = torch.randn(4, 8, device="tpu")
layer = torch.nn.Linear(8, 8).to("tpu")
with torch.autocast("tpu"):
    y = layer(x)
    mm = x @ x.t()
    loss = torch.nn.functional.mse_loss(y, torch.zeros_like(y))
    relu = torch.relu(x)
    default = torch.get_autocast_dtype("tpu")
    y.float().sum().backward()
print(json.dumps({k: str(v) for k, v in {"linear": y.dtype, "mm": mm.dtype, "loss": loss.dtype, "relu": relu.dtype, "default": default, "grad": layer.weight.grad.dtype}.items()}))
