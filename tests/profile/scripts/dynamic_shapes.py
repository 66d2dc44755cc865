"""Seeded problem: the sequence length changes every step (SH-1 at the model call)."""

import torch

device = torch.device("tpu")
embed = torch.nn.Embedding(1000, 256).to(device)
head = torch.nn.Linear(256, 256).to(device)
optimizer = torch.optim.SGD(list(embed.parameters()) + list(head.parameters()), lr=0.01)
generator = torch.Generator().manual_seed(0)
for step in range(10):
    length = 32 + 7 * step  # a new sequence length every step  DRIVER: SH-1
    tokens = torch.randint(0, 1000, (8, length), generator=generator).to(device)  # CREATED: SH-1
    loss = head(embed(tokens)).square().mean()  # SEED: SH-1
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
