"""Two-rank FSDP2 fully_shard + DTensor on init_device_mesh("tpu"), with the mixed cpu:gloo,tpu:tpu_dist
backend string; then pinned memory and the host's device count in the same ranks (one multi-rank run checks both:
each costs seconds of process start-up); writes results-rank<R>.json with losses to compare against an unsharded
run and the host-memory observations. Functional collectives are checked as pytorch/examples' FSDP2 example uses
them: results that must be waited for, and a gradient-norm reduction nothing reads right before the group goes.

Usage: dist_fsdp.py OUT_DIR
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def meta_initialised(mesh) -> list:  # noqa: ANN001 - a DeviceMesh
    """FSDP2's meta-device initialisation (torchtitan's): DTensor draws each shard of a parameter at its own
    offset of the device generator's state, which it reads and writes as a CUDA generator's (seed, offset)."""
    torch.manual_seed(1)
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="tpu")
    for layer in model:
        layer.reset_parameters()
    return [p.full_tensor().cpu().flatten().tolist() for p in model.parameters()]


def host_memory() -> dict:
    """Pinned memory and the host's device count, as a rank of a multi-rank run sees them."""
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    data = TensorDataset(torch.arange(16.0).view(8, 2))
    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=False), pin_memory=True, pin_memory_device="tpu")
    total = torch.zeros(2, device="tpu")
    pinned = []
    for (batch,) in loader:
        pinned.append(batch.is_pinned())
        total += batch.to("tpu", non_blocking=True).sum(0)
    dist.all_reduce(total)
    host = torch.ones(3).pin_memory()
    enough = torch.accelerator.device_count() >= local_world  # the check real launch scripts make
    return {
        "device_count": torch.accelerator.device_count(),
        "devices_per_rank": torch.accelerator.device_count() // local_world,
        "enough_devices": enough,
        "current_device": torch.accelerator.current_device_index(),
        "pinned_batches": pinned,
        "pinned_host": [host.is_pinned(), host.to("tpu", non_blocking=True).cpu().tolist()],
        "total": total.cpu().tolist(),
    }


def main() -> None:
    out_dir = sys.argv[1]
    torch.set_float32_matmul_precision("highest")
    dist.init_process_group("cpu:gloo,tpu:tpu_dist")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (world,))

    full = torch.arange(8.0, device="tpu")
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    replicated = sharded.redistribute(mesh, [Replicate()])

    generator = torch.Generator().manual_seed(7)
    batches = [(torch.randn(2 * world, 8, generator=generator), torch.randn(2 * world, 4, generator=generator)) for _ in range(3)]

    model = make_model().to("tpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fsdp_losses = []
    for x, y in batches:
        mine = slice(2 * rank, 2 * rank + 2)
        loss = torch.nn.functional.mse_loss(model(x[mine].to("tpu")), y[mine].to("tpu"))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        fsdp_losses.append(total.item())

    # The same training, unsharded, on the whole batch: FSDP must give the same losses.
    plain = make_model().to("tpu")
    plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
    plain_losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(plain(x.to("tpu")), y.to("tpu"))
        loss.backward()
        plain_optimizer.step()
        plain_optimizer.zero_grad()
        plain_losses.append(loss.item())

    results = {
        "rank": rank,
        "local_shard": sharded.to_local().cpu().tolist(),
        "full_tensor": sharded.full_tensor().cpu().tolist(),
        "replicated_local": replicated.to_local().cpu().tolist(),
        "param_is_dtensor": type(next(model.parameters())).__name__,
        "param_device": str(next(model.parameters()).to_local().device),
        "fsdp_losses": fsdp_losses,
        "plain_losses": plain_losses,
        "host_memory": host_memory(),
        "meta_init": meta_initialised(mesh),
    }
    gathered = funcol.all_gather_tensor(sharded.to_local(), 0, mesh)
    results["async_result"] = [type(gathered).__name__, gathered.wait().cpu().tolist()]
    # used without a wait as an op's second argument, after a tpu tensor (sequence parallelism's redistribute(async_op=True))
    unwaited = funcol.all_gather_tensor(sharded.to_local(), 0, mesh)
    results["async_used"] = torch.addcmul(torch.ones(8, device="tpu"), unwaited, torch.ones(8, device="tpu")).cpu().tolist()
    results["unwaited_works"] = torch._C._distributed_c10d._get_work_registry_size()
    with open(os.path.join(out_dir, f"results-rank{rank}.json"), "w") as handle:
        json.dump(results, handle)
    model(batches[0][0][:2].to("tpu")).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # its all-reduce is never read
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
