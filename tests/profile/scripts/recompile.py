"""Seeded problem: the compiled step sees a new batch size every step (CO-1: created here, compiled there)."""

import torch

device = torch.device("tpu")
model = torch.nn.Linear(256, 256).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile(backend="tpu")  # COMPILED: CO-1
def forward_loss(x: torch.Tensor) -> torch.Tensor:
    return model(x).relu().square().mean()


for step in range(8):  # DRIVER: the batch size grows with step
    batch = torch.randn(16 + 8 * step, 256, device=device)  # SEED: CO-1  CREATED: CO-1
    loss = forward_loss(batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
