"""Seeded problem: variable-length sentences batched by a pad_sequence collate, so each batch is as long as its
longest sentence (SH-1 at the loop that receives the batch, its size from the loader). The loss ignores the padding
id, so padding the batch to a bucket keeps the losses: the diff verifies."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

PAD = 0


class Sentences(Dataset):
    """Token sequences of random length (fixed once, like a tokenised corpus)."""

    def __init__(self, count: int, vocab: int, max_len: int) -> None:
        generator = torch.Generator().manual_seed(2)
        lengths = torch.randint(8, max_len, (count,), generator=generator)
        self.items = [torch.randint(1, vocab, (int(n),), generator=generator) for n in lengths]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.items[index]


def collate(batch: list[torch.Tensor]) -> torch.Tensor:
    return pad_sequence(batch, batch_first=True, padding_value=PAD)


class Tagger(nn.Module):
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width, padding_idx=PAD)
        self.proj = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.tanh(self.embed(tokens)))


def train_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for tokens in loader:  # SEED: SH-1
        tokens = tokens.to(device)
        logits = model(tokens)
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), ignore_index=PAD
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=200)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    device = torch.device("tpu")
    model = Tagger(args.vocab, args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Sentences(96, args.vocab, 100), batch_size=args.batch_size, collate_fn=collate)  # DRIVER: SH-1
    train_epoch(model, loader, optimizer, device)


if __name__ == "__main__":
    main()
