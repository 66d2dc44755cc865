"""A well-tuned step: bf16 autocast, 256-aligned dims, fixed shapes, no host reads in the loop."""

import torch

device = torch.device("tpu")
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
total = torch.zeros((), device=device)
for step in range(12):
    x = torch.randn(256, 512, device=device)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = model(x).float().square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total += loss.detach()
print(f"mean loss {total.item() / 12:.4f}")
