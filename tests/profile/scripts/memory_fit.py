"""Seeded problem: replicated fp32 + Adam state of a 1.1B-parameter model cannot fit one v5e (SD-1).

The model is built on the ``meta`` device: real shapes and dtypes, no storage, so the test stays cheap while
the profiler measures parameter, gradient and optimizer-state bytes exactly as for a real model.
"""

import torch

with torch.device("meta"):
    model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(16)])
optimizer = torch.optim.Adam(model.parameters())
for step in range(6):
    x = torch.randn(4, 8192, device="meta")
    loss = model(x).sum()  # SEED: SD-1
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
