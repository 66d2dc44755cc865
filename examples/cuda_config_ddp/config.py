"""Training configuration: dataclass defaults, overridable from the command line (the usual research-repo shape)."""

import argparse
from dataclasses import dataclass, fields


@dataclass
class TrainConfig:
    device: str = "cuda"
    dist_backend: str = "nccl"
    seed: int = 1234
    steps: int = 20
    batch_size: int = 16
    seq_len: int = 32
    vocab_size: int = 256
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    lr: float = 3e-4
    amp: bool = False
    resume: str = ""


def parse_config(argv=None) -> TrainConfig:
    parser = argparse.ArgumentParser(description="Train a small attention model with DDP")
    parser.add_argument("--device", type=str, default="cuda", choices=["cpu", "cuda"], help="device to train on")
    parser.add_argument("--dist-backend", type=str, default="nccl", help="torch.distributed backend")
    for field in fields(TrainConfig):
        if field.name in ("device", "dist_backend"):
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.type in (bool, "bool"):
            parser.add_argument(flag, action="store_true")
        else:
            kind = {"int": int, "float": float, "str": str}.get(str(field.type), field.type)
            parser.add_argument(flag, type=kind, default=field.default)
    args = parser.parse_args(argv)
    return TrainConfig(**vars(args))
