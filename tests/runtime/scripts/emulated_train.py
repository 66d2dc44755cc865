"""Trains one MLP with AdamW once per RUN argument, all in this one process (torch and the emulation are imported
once for all of them); prints the loss lists by RUN.

A RUN is ``DEVICE:OPTIMIZER:PRECISION[:EAGER_MODE]``: cpu or tpu, foreach or fused, the float32 matmul precision,
and for tpu runs an eager mode (``torch.tpu.EagerMode`` name) switched to in-process before training.
"""

import json
import sys

import torch

from tpu_agent.runtime.emulated import activate

activate()


def train(device: str, optimizer_kind: str) -> list[float]:
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


results = {}
for run in sys.argv[1:]:
    device, optimizer_kind, precision, *eager_mode = run.split(":")
    torch.set_float32_matmul_precision(precision)
    if eager_mode:
        torch.tpu.eager_mode = torch.tpu.EagerMode[eager_mode[0]]
    results[run] = train(device, optimizer_kind)
print(json.dumps(results))
