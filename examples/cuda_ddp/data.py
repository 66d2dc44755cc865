"""Synthetic next-token data: sequences of a repeating pattern, so the loss has something to learn."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class PatternDataset(Dataset):
    """Each sample is a random-phase walk through a fixed permutation of the vocabulary."""

    def __init__(self, vocab_size: int, seq_len: int, num_samples: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.permutation = torch.randperm(vocab_size, generator=generator)
        self.starts = torch.randint(0, vocab_size, (num_samples,), generator=generator)
        self.vocab_size = vocab_size
        self.seq_len = seq_len

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = (self.starts[index] + torch.arange(self.seq_len + 1)) % self.vocab_size
        sequence = self.permutation[positions]
        return sequence[:-1], sequence[1:]


def make_loader(dataset: Dataset, batch_size: int, distributed: bool, pin_memory: bool) -> DataLoader:
    sampler = DistributedSampler(dataset, shuffle=True, seed=0) if distributed else None
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=sampler is None,
        drop_last=True,
        num_workers=0,
        pin_memory=pin_memory,
        pin_memory_device="cuda" if pin_memory else "",
    )
