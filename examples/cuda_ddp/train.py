"""Train TinyGPT with DistributedDataParallel and mixed precision on NVIDIA GPUs.

Launch with launch.sh (torchrun), or `python train.py` for a single process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from data import PatternDataset, make_loader
from model import TinyGPT, count_parameters

VOCAB_SIZE = 64
DEFAULT_DEVICE = "cuda"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--amp", action="store_true", help="fp16 autocast with loss scaling")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--pin-memory", action="store_true")
    parser.add_argument("--checkpoint", type=Path, default=None, help="save (and resume from) this file")
    return parser.parse_args()


def setup_distributed() -> tuple[int, int, int]:
    """Returns (rank, local_rank, world_size); initialises NCCL when launched by torchrun."""
    if "WORLD_SIZE" not in os.environ:
        return 0, 0, 1
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    if dist.get_backend() == "nccl":
        os.environ.setdefault("NCCL_ASYNC_ERROR_HANDLING", "1")
    return dist.get_rank(), local_rank, dist.get_world_size()


def main() -> None:
    args = parse_args()
    rank, local_rank, world_size = setup_distributed()
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")

    torch.manual_seed(args.seed)
    if use_cuda:
        torch.cuda.manual_seed_all(args.seed)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    model = TinyGPT(VOCAB_SIZE, args.d_model, n_heads=4, n_layers=args.layers, max_seq_len=args.seq_len)
    model = model.cuda() if use_cuda else model
    if rank == 0:
        print(f"model: {count_parameters(model)} on {torch.cuda.get_device_name() if use_cuda else 'cpu'}")
    if world_size > 1:
        model = DDP(model, device_ids=[local_rank] if use_cuda else None, output_device=local_rank if use_cuda else None)
    if args.compile:
        model = torch.compile(model, mode="max-autotune")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    use_amp = args.amp and use_cuda
    scaler = torch.cuda.amp.GradScaler(enabled=use_amp)

    start_step = 0
    if args.checkpoint is not None and args.checkpoint.exists():
        state = torch.load(args.checkpoint, map_location=f"cuda:{local_rank}" if use_cuda else "cpu")
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step = state["step"]

    dataset = PatternDataset(VOCAB_SIZE, args.seq_len, num_samples=args.batch_size * world_size * args.steps, seed=args.seed)
    loader = make_loader(dataset, args.batch_size, distributed=world_size > 1, pin_memory=args.pin_memory)

    if use_cuda:
        start_event = torch.cuda.Event(enable_timing=True)
        end_event = torch.cuda.Event(enable_timing=True)
        start_event.record()
    wall_start = time.perf_counter()

    model.train()
    for step, (inputs, targets) in enumerate(loader, start=start_step):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.cuda(non_blocking=True) if use_cuda else targets
        with torch.cuda.nvtx.range(f"step {step}") if use_cuda else contextlib.nullcontext():
            try:
                with torch.cuda.amp.autocast(enabled=use_amp, dtype=torch.float16):
                    logits = model(inputs)
                    loss = F.cross_entropy(logits.view(-1, VOCAB_SIZE), targets.view(-1))
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                raise
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)

    if use_cuda:
        end_event.record()
        torch.cuda.synchronize()
        elapsed_ms = start_event.elapsed_time(end_event)
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        elapsed_ms = (time.perf_counter() - wall_start) * 1000
        peak_mb = 0.0
    if rank == 0:
        print(f"done: {args.steps} steps in {elapsed_ms / 1000:.2f}s, peak memory {peak_mb:.1f} MiB")
        if args.checkpoint is not None:
            state = {"model": getattr(model, "module", model).state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}
            torch.save(state, args.checkpoint)

    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
