"""Trains one MLP on cpu and on the emulated tpu with AdamW (foreach or fused); prints both loss lists."""

import json
import sys

import torch

from tpu_agent.runtime.emulated import activate

optimizer_kind, precision = sys.argv[1], sys.argv[2]
activate()
torch.set_float32_matmul_precision(precision)


def train(device: str) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **{optimizer_kind: True})
    data = torch.randn(64, 16)
    target = data.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data.to(device)), target.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


print(json.dumps({"cpu": train("cpu"), "tpu": train("tpu")}))
