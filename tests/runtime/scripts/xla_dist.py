"""Two ranks training a torch.compile(backend="tpu") model through XLA with tpu_dist gradient all-reduces, and
a compiled function with a collective inside it (Dynamo breaks the graph there). Writes results-rank<R>.json.

Usage: xla_dist.py OUT_DIR
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F


def model_and_data() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.linspace(-2, 2, 16 * 8).reshape(16, 8)
    y = torch.arange(16) % 4
    return model, x, y


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_float32_matmul_precision("highest")

    reference, x, y = model_and_data()  # full batch on the CPU: what the two ranks must reproduce together
    F.cross_entropy(reference(x), y).backward()

    model, _, _ = model_and_data()
    model = model.to("tpu")
    compiled = torch.compile(model, backend="tpu")
    shard = slice(rank * 8, (rank + 1) * 8)
    loss = F.cross_entropy(compiled(x[shard].to("tpu")), y[shard].to("tpu"))
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    grad_diff = max(
        float((p.grad.cpu() - r.grad).abs().max()) for p, r in zip(model.parameters(), reference.parameters())
    )

    def summed_square(t: torch.Tensor) -> torch.Tensor:
        s = (t * t).sum()
        dist.all_reduce(s)  # a collective inside the compiled function: a graph break, run eagerly
        return s + 1

    value = torch.compile(summed_square, backend="tpu")(torch.full((4,), float(rank + 1), device="tpu"))
    from tpu_agent.runtime.xla import cache

    result = {"grad_diff": grad_diff, "collective_in_graph": float(value), "compiles": cache.executables.stats.compiles}
    with open(os.path.join(out_dir, f"results-rank{rank}.json"), "w") as handle:
        json.dump(result, handle)
    dist.destroy_process_group()


main()
