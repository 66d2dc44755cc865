"""Seeded problem: Strict eager running hundreds of tiny ops per step (EM-1 at the optimizer step)."""

import torch

device = torch.device("tpu")
weights = [torch.nn.Parameter(torch.randn(16, device=device)) for _ in range(40)]
optimizer = torch.optim.SGD(weights, lr=0.01)
x = torch.randn(16, device=device)
for step in range(10):
    h = x
    for w in weights:
        h = torch.tanh(h * w + 0.5) - 0.1 * h
    loss = h.square().mean()
    loss.backward()
    optimizer.step()  # SEED: EM-1
    optimizer.zero_grad()
