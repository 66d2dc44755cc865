"""Seeded problem: fp32 matmuls (PR-1 at the forward call) with dims that waste the MXU (SH-2 at fc1)."""

import torch


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(200, 600)  # SEED: SH-2
        self.fc2 = torch.nn.Linear(600, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


device = torch.device("tpu")
model = Mlp().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10):
    x = torch.randn(128, 200, device=device)
    loss = model(x).square().mean()  # SEED: PR-1
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
