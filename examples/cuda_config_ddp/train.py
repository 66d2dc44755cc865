"""DDP training driven by TrainConfig: device and backend come from the config, not from the call sites."""

import os

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from config import parse_config
from dist_utils import all_reduce_mean, cleanup, setup_distributed
from model import TinyLM


def synthetic_batch(cfg, generator):
    # a fixed synthetic language: next token = (token * 7 + 3) mod vocab
    start = torch.randint(0, cfg.vocab_size, (cfg.batch_size, 1), generator=generator)
    steps = torch.arange(cfg.seq_len + 1).unsqueeze(0)
    seq = (start * 7 ** steps + 3 * steps) % cfg.vocab_size
    return seq[:, :-1], seq[:, 1:]


def main():
    cfg = parse_config()
    rank, local_rank, world_size = setup_distributed(cfg)
    torch.manual_seed(cfg.seed)
    torch.cuda.manual_seed_all(cfg.seed)
    torch.backends.cudnn.benchmark = True

    device = torch.device(cfg.device, local_rank)
    model = TinyLM(cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.seq_len).to(device)
    if cfg.resume and os.path.exists(cfg.resume):
        state = torch.load(cfg.resume, map_location=lambda storage, loc: storage.cuda(local_rank))
        model.load_state_dict(state)
    if world_size > 1:
        model = DDP(model, device_ids=[local_rank], output_device=local_rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    scaler = torch.cuda.amp.GradScaler(enabled=cfg.amp)
    generator = torch.Generator().manual_seed(cfg.seed + rank)

    if rank == 0:
        print(f"training on {cfg.device} with backend {cfg.dist_backend}, world size {world_size}")
    for step in range(cfg.steps):
        inputs, targets = synthetic_batch(cfg, generator)
        inputs, targets = inputs.cuda(local_rank, non_blocking=True), targets.to(local_rank)
        with torch.autocast(device_type=cfg.device, dtype=torch.bfloat16, enabled=cfg.amp):
            logits = model(inputs)
            loss = F.cross_entropy(logits.view(-1, cfg.vocab_size), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        mean_loss = all_reduce_mean(loss.detach().clone(), world_size)
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {mean_loss.item():.4f}")
    torch.cuda.synchronize()
    print(f"rank {rank} done: final loss {mean_loss.item():.4f} on {next(model.parameters()).device.type}")
    cleanup()


if __name__ == "__main__":
    main()
