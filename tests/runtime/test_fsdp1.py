"""FSDP1 (``FullyShardedDataParallel``) on the tpu device, as ``tpu-agent migrate`` leaves a CUDA script: it frees
and re-allocates flat parameters through ``_typed_storage()._resize_``, compares storages by ``data_ptr`` and
records streams with torch dispatch off, all of which the emulation provides (:mod:`storage`). A full state
dict with ``offload_to_cpu=True`` under a sharded strategy holds CPU tensors, as on a GPU (:mod:`fsdp1_offload`),
though a tpu tensor cannot move to the CPU in place (``t.data = t.cpu()``, refused with the fix). The hybrid
strategies train on a device mesh; without one, FSDP1's per-host groups need one rank per device, and two ranks
on a four-device host are refused with the way out (:mod:`fsdp1_hybrid`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_launch_util import clean_env, run_script, tpu_agent

STORAGE_SCRIPT = r"""
import json, warnings
import torch
from torch.distributed.utils import _alloc_storage, _free_storage, _data_ptr_allocated
from torch.distributed.fsdp._common_utils import _no_dispatch_record_stream
from torch.distributed.fsdp._flat_param import _same_storage, _same_storage_size
from tpu_agent.runtime.emulated import activate

warnings.simplefilter("ignore")
activate()
flat = torch.arange(8.0, device="tpu")
view, other = flat[2:], torch.zeros(8, device="tpu")
out = {"same": [_same_storage(flat, view), _same_storage(flat, other)], "allocated": _data_ptr_allocated(flat)}
_no_dispatch_record_stream(flat, torch.accelerator.current_stream())  # as FSDP1 does, torch dispatch off
_free_storage(flat)
out["freed"] = [_same_storage_size(flat, 0), _data_ptr_allocated(flat), flat._typed_storage()._size()]
_alloc_storage(flat, torch.Size([8]))
flat.fill_(3.0)
out["reallocated"] = [flat._typed_storage()._size(), view.cpu().tolist()]
try:  # a tpu wrapper cannot become a CPU tensor in place: refused by name
    flat.data = flat.cpu()
except RuntimeError as error:
    out["to_cpu"] = str(error)
print(json.dumps(out))
"""


def test_fsdp1_storage_helpers_free_and_reallocate_a_tpu_flat_parameter(tmp_path: Path) -> None:
    out = run_script(STORAGE_SCRIPT, tmp_path)
    assert out["same"] == [True, False]
    assert out["allocated"] is True
    assert out["freed"] == [True, False, 0]
    assert out["reallocated"] == [8, [3.0] * 6]
    assert "cannot move to the CPU in place" in out["to_cpu"] and "t.cpu()" in out["to_cpu"]


TRAIN_SCRIPT = r"""
import functools, json, os, sys
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import (FullyShardedDataParallel as FSDP, FullStateDictConfig, MixedPrecision,
                                    ShardingStrategy, StateDictType)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

STEPS, BATCH = 3, 8


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), Block(32), Block(32), nn.Linear(32, 4))


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 4, generator=g)) for _ in range(STEPS)]


def reference():
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches():
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step(); opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.tolist() for k, v in model.state_dict().items()}


def train(strategy, policy, mixed, rank, world):
    wrap = (functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}) if policy == "transformer"
            else functools.partial(size_based_auto_wrap_policy, min_num_params=1000))
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
    # hybrid: shard over both ranks, replicate over one group of them (the other way round FSDP makes NO_SHARD)
    mesh = init_device_mesh("tpu", (1, world), mesh_dim_names=("replicate", "shard")) if "HYBRID" in strategy else None
    model = FSDP(build().to("tpu"), device_id=torch.accelerator.current_device_index(), auto_wrap_policy=wrap,
                 sharding_strategy=getattr(ShardingStrategy, strategy), mixed_precision=mp if mixed else None,
                 device_mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, per = [], BATCH // world
    for x, y in batches():
        x, y = x[rank * per:(rank + 1) * per].to("tpu"), y[rank * per:(rank + 1) * per].to("tpu")
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        model.clip_grad_norm_(0.5)
        opt.step(); opt.zero_grad()
        dist.all_reduce(total := loss.detach().clone())
        losses.append(total.item() / world)
    # torch refuses offload_to_cpu with NO_SHARD; with sharding, the full state dict is gathered onto the host
    config = FullStateDictConfig(offload_to_cpu=strategy != "NO_SHARD", rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
        state = model.state_dict()
    if rank == 0:
        torch.save(state, "ckpt.pt")
        return {"losses": losses, "state": {k: v.cpu().tolist() for k, v in state.items()},
                "devices": sorted({v.device.type for v in state.values()})}
    if strategy != "NO_SHARD":
        assert not state, state.keys()  # rank0_only: the other ranks get nothing (NO_SHARD ignores it)


def hybrid_without_mesh():  # FSDP1's own hybrid groups: one per host of device_count() ranks (1: one per process)
    try:
        FSDP(build().to("tpu"), sharding_strategy=ShardingStrategy.HYBRID_SHARD,
             auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=1000))
    except ValueError as error:
        return str(error)


def fsdp(specs):  # each of specs (comma-separated STRATEGY:POLICY:PRECISION) trained from a fresh model, in turn
    dist.init_process_group("tpu_dist")
    rank, world = dist.get_rank(), dist.get_world_size()
    runs = {}
    for spec in specs.split(","):
        strategy, policy, precision = spec.split(":")
        runs[spec] = train(strategy, policy, precision == "bf16", rank, world)
    refused = hybrid_without_mesh() if "HYBRID" in specs else None
    if rank == 0:
        Path = __import__("pathlib").Path
        Path(os.environ["OUT"]).write_text(json.dumps({"runs": runs, "hybrid_without_mesh": refused}))
    dist.destroy_process_group()


torch.set_float32_matmul_precision("highest")
if sys.argv[1] == "ref":
    losses, state = reference()
    print(json.dumps({"losses": losses, "state": state}))
else:
    fsdp(sys.argv[1])
"""


@pytest.fixture(scope="module")
def reference(run_once: Callable[..., Any]) -> dict:
    """The CPU process's run, once per session (run_once), also when pytest-xdist splits this module."""
    return run_once("fsdp1-reference", lambda directory: run_script(TRAIN_SCRIPT, directory, "ref"))


# Every FSDP1 configuration the tests check, trained one after another by the same two ranks (a fresh model each):
# the hybrid strategies on a device mesh and NO_SHARD in fp32 with the size-based wrap policy, SHARD_GRAD_OP in bf16
# with the transformer policy. One launch of two ranks instead of one per configuration.
SHARDED = ("FULL_SHARD:size:fp32", "HYBRID_SHARD:size:fp32", "_HYBRID_SHARD_ZERO2:size:fp32")
NO_SHARD = ("NO_SHARD:size:fp32",)
MIXED = "SHARD_GRAD_OP:transformer:bf16"


@pytest.fixture(scope="module")
def fsdp_runs(run_once: Callable[..., Any]) -> dict:
    """rank 0's output of the two-rank run of every configuration above, once per session (run_once)."""

    def launch(directory: Path) -> dict:
        script, out = directory / "train.py", directory / "out.json"
        script.write_text(TRAIN_SCRIPT)
        env = clean_env(PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH")])), OUT=str(out))
        specs = ",".join((*SHARDED, *NO_SHARD, MIXED))
        result = tpu_agent(
            "run", "--nproc", "2", "--backend", "emulated", str(script), specs, cwd=directory, env=env, timeout=240
        )
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        assert (directory / "ckpt.pt").exists()
        return dict(json.loads(out.read_text()))

    return dict(run_once("fsdp1-two-ranks", launch))


def _flat(value: object) -> list[float]:
    """A nested list of numbers (a state-dict tensor's ``tolist()``) as one flat list."""
    if isinstance(value, list):
        return [x for v in value for x in _flat(v)]
    assert isinstance(value, float | int)
    return [float(value)]


def _close(a: list[float], b: list[float], tol: float) -> bool:
    return all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("specs", [SHARDED, NO_SHARD], ids=["FULL_SHARD,HYBRID_SHARD,_HYBRID_SHARD_ZERO2", "NO_SHARD"])
def test_fsdp1_on_two_ranks_trains_as_one_cpu_process(fsdp_runs: dict, reference: dict, specs: tuple[str, ...]) -> None:
    """The hybrid strategies (in the FULL_SHARD group) on a device mesh: shard over the two ranks, one replica."""
    for spec in specs:
        strategy, out = spec.split(":")[0], fsdp_runs["runs"][spec]
        assert _close(out["losses"], reference["losses"], 1e-5), (strategy, out["losses"], reference["losses"])
        assert out["state"].keys() == reference["state"].keys()
        for name, value in reference["state"].items():
            assert _close(_flat(out["state"][name]), _flat(value), 1e-4), (strategy, name)
        # offloaded (the sharded strategies) the full state dict is on the host, as FSDP1 gives it on a GPU
        assert out["devices"] == (["tpu"] if strategy == "NO_SHARD" else ["cpu"]), strategy
    if specs == SHARDED:
        # without a mesh FSDP1 makes one group per host of device_count() ranks; each TorchTPU process sees its
        # one chip, so the groups are single ranks (shard over one, replicate over all) and nothing is refused
        assert fsdp_runs["hybrid_without_mesh"] is None, fsdp_runs["hybrid_without_mesh"]


@pytest.mark.slow
def test_fsdp1_bf16_mixed_precision_stays_near_the_fp32_run(fsdp_runs: dict, reference: dict) -> None:
    """SHARD_GRAD_OP with a transformer wrap policy, in bf16: near the fp32 CPU run, offloaded state on the host."""
    out = fsdp_runs["runs"][MIXED]
    assert _close(out["losses"], reference["losses"], 2e-2), (out["losses"], reference["losses"])
    assert out["devices"] == ["cpu"]
