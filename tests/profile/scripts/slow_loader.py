"""Seeded problem: a slow Dataset read in the main process (IP-1 at the DataLoader, with num_workers)."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)  # decoding / augmentation that should run in worker processes
        sample = torch.randn(512, generator=torch.Generator().manual_seed(index))  # the same item in any worker
        return sample[:256], sample[256:]


device = torch.device("tpu")
model = torch.nn.Linear(256, 256).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(SlowDataset(), batch_size=16)  # SEED: IP-1
for x, y in loader:
    loss = (model(x.to(device)) - y.to(device)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
