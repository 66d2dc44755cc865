"""Seeded problem: a language model fed batches whose length is drawn in Python every step (SH-1 at the tensor made
from that length, its size from `seq_len`). The loss ignores the padding id, so padding the batch is a fix that keeps
the losses: the diff verifies."""

import argparse
import random

import torch
import torch.nn.functional as F
from torch import nn

PAD = 0


class TokenMLP(nn.Module):
    """A per-token model: embedding, a hidden layer, the vocabulary head."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width, padding_idx=PAD)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(self.embed(tokens))))


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy; padding positions (PAD) do not count."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), ignore_index=PAD)


def train(args: argparse.Namespace) -> None:
    device = torch.device("tpu")
    random.seed(args.seed)
    model = TokenMLP(args.vocab, args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        seq_len = random.randint(args.min_len, args.max_len)  # DRIVER: SH-1
        tokens = torch.randint(1, args.vocab, (args.batch_size, seq_len)).to(device)  # SEED: SH-1
        loss = lm_loss(model(tokens), tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--min-len", type=int, default=20)
    parser.add_argument("--max-len", type=int, default=120)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    train(parser.parse_args())


if __name__ == "__main__":
    main()
