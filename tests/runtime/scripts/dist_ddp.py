"""Two-rank DDP on the emulated tpu device plus TorchTPU's collective rules; writes results-rank<R>.json.

Usage: dist_ddp.py OUT_DIR
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def error_of(call):
    try:
        call()
    except (RuntimeError, ValueError) as error:
        return str(error)
    return None


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group()  # no backend: the tpu device's default, tpu_dist
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.distributed_c10d._get_default_group()

    torch.set_float32_matmul_precision("highest")  # full f32 on the MXU, so CPU gradients compare exactly
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("tpu")
    reference = [p.detach().cpu().clone() for p in model.parameters()]
    ddp = DDP(model)  # no device_ids, as TorchTPU requires
    generator = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(4, 8, generator=generator)
    y = torch.randn(4, 1, generator=generator)
    torch.nn.functional.mse_loss(ddp(x.to("tpu")), y.to("tpu")).backward()
    ddp_grads = [p.grad.cpu().reshape(-1).tolist() for p in model.parameters()]

    # The same step without DDP on plain CPU: DDP's gradient must be the mean of these over the ranks.
    local = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        for p, r in zip(local.parameters(), reference):
            p.copy_(r)
    torch.nn.functional.mse_loss(local(x), y).backward()
    local_grads = [p.grad.reshape(-1).tolist() for p in local.parameters()]

    t = torch.ones(4, device="tpu")
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank})
    results = {
        "rank": rank,
        "process_group": type(group).__name__,
        "backend": group.getBackendName(),
        "visible_devices": os.environ.get("TPU_VISIBLE_DEVICES"),
        "topology": os.environ.get("TORCH_TPU_TOPOLOGY"),
        "slicebuilder": os.environ.get("TORCH_TPU_SLICEBUILDER_ADDRESSES"),
        "ddp_grads": ddp_grads,
        "local_grads": local_grads,
        "objects": gathered,
        "errors": {
            "reduce": error_of(lambda: dist.reduce(t, 0)),
            "premul_sum": error_of(lambda: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))),
            "monitored_barrier": error_of(lambda: group.monitored_barrier()),
            "uneven": error_of(lambda: dist.all_reduce(torch.ones(3 + rank, device="tpu"))),
            "barrier_device_ids": error_of(lambda: dist.barrier(device_ids=[1])),
            # rank 0 broadcasts while rank 1 all-reduces: both must get an error, not a hang
            "desync": error_of(lambda: dist.broadcast(t, 0) if rank == 0 else dist.all_reduce(t)),
        },
    }
    message = torch.full((3,), 7.0, device="tpu") if rank == 0 else torch.zeros(3, device="tpu")
    dist.send(message, 1) if rank == 0 else dist.recv(message, 0)
    results["received"] = message.cpu().tolist()
    avg = torch.full((2,), float(rank + 1), device="tpu")
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    results["avg"] = avg.cpu().tolist()
    with open(os.path.join(out_dir, f"results-rank{rank}.json"), "w") as handle:
        json.dump(results, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
