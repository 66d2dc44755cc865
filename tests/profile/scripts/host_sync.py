"""Seeded problem: a Python float accumulated with .item() every step (HS-1 at the `total +=` line)."""

import torch

device = torch.device("tpu")
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
total = 0.0
for step in range(10):
    x = torch.randn(64, 256, device=device)
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total += loss.item()  # SEED: HS-1
print(f"mean loss {total / 10:.4f}")
