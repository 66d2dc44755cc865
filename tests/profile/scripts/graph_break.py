"""Seeded problem: a print inside the compiled step breaks the graph (CO-2 at the print line)."""

import torch

device = torch.device("tpu")
model = torch.nn.Linear(256, 256).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile(backend="tpu")
def forward_loss(x: torch.Tensor) -> torch.Tensor:
    y = model(x).relu()
    print("forward done")  # SEED: CO-2
    return y.square().mean()


for step in range(8):
    loss = forward_loss(torch.randn(64, 256, device=device))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
