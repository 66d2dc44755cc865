"""``tpu-agent run --nproc 2``: torchrun ranks on the emulated device, the tpu_dist process group, failures.

Multi-rank runs are slow on a small machine, so each test launches one run and checks several things.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_launch_util import SCRIPTS, clean_env, flat, tpu_agent

from tpu_agent.runtime.events import Collective, RunInfo, iter_kind, read_events

pytestmark = pytest.mark.slow  # every test launches fresh torch processes


def _results(out_dir: Path) -> dict[int, dict]:
    return {
        int(p.stem.removeprefix("results-rank")): json.loads(p.read_text()) for p in out_dir.glob("results-rank*.json")
    }


def test_ddp_gives_identical_averaged_gradients_and_tpu_rules_hold(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "rankhook.py").write_text(
        "import os\nfrom pathlib import Path\ndef mark():\n    Path(os.environ['HOOK_OUT'], 'hook-rank' + os.environ['RANK']).write_text('ok')\n"
    )
    events_dir = tmp_path / "events"
    env = clean_env(
        PYTHONPATH=str(hooks),
        HOOK_OUT=str(tmp_path),
        TPU_AGENT_HOOKS="rankhook:mark",
        TPU_AGENT_EVENTS_DIR=str(events_dir),
    )
    result = tpu_agent(
        "run",
        "--nproc",
        "2",
        "--backend",
        "emulated",
        str(SCRIPTS / "dist_ddp.py"),
        str(tmp_path),
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    ranks = _results(tmp_path)
    assert sorted(ranks) == [0, 1]
    for rank, seen in ranks.items():
        assert seen["process_group"] == "ProcessGroupTpu" and seen["backend"] == "tpu_dist"
        assert seen["visible_devices"] == str(rank)
        assert seen["topology"] == "1,2,1"
        assert len(seen["slicebuilder"].split(",")) == 2
        assert seen["objects"] == [{"rank": 0}, {"rank": 1}]
        assert seen["avg"] == [1.5, 1.5]
        assert seen["received"] == [7.0, 7.0, 7.0]
        errors = seen["errors"]
        assert "does not support reduce" in errors["reduce"]
        assert "'premul_sum' reduction is not supported" in errors["premul_sum"]
        assert "only GLOO supports monitored barrier" in errors["monitored_barrier"]
        assert "asymmetric input buffer sizes across ranks are not supported on TPU." in errors["uneven"]
        assert "device_ids" in errors["barrier_device_ids"]
        assert "ranks issued different collectives" in errors["desync"]
        assert "rank 0 broadcast, rank 1 all_reduce" in errors["desync"]
        assert (tmp_path / f"hook-rank{rank}").read_text() == "ok"
    # identical on both ranks, and equal to the mean of the per-rank CPU gradients (so they were all-reduced)
    assert ranks[0]["ddp_grads"] == ranks[1]["ddp_grads"]
    for ddp, g0, g1 in zip(ranks[0]["ddp_grads"], ranks[0]["local_grads"], ranks[1]["local_grads"], strict=True):
        assert ddp == pytest.approx([(a + b) / 2 for a, b in zip(g0, g1, strict=True)], rel=1e-5, abs=1e-6)
    assert ranks[0]["local_grads"] != ranks[1]["local_grads"]
    events = read_events(events_dir)
    for rank in (0, 1):
        assert [e.world_size for e in iter_kind(events[rank], RunInfo)] == [2]
        ops = {e.op for e in iter_kind(events[rank], Collective)}
        assert {"all_reduce", "broadcast", "send" if rank == 0 else "recv"} <= ops


def _fsdp_run(out: Path) -> dict[int, dict]:
    # DeferAndFuse here (DDP above runs Strict): collectives and FSDP2's buffer frees must flush pending work
    args = ["--nproc", "2", "--backend", "emulated", "--eager-mode", "defer-and-fuse"]
    result = tpu_agent("run", *args, str(SCRIPTS / "dist_fsdp.py"), str(out), timeout=240)
    assert result.returncode == 0, result.stderr
    # errors at exit (a deferred collective run after its group was destroyed) and c10d's warning about
    # collectives never waited for do not change the exit code: the ranks' stderr must show neither
    problems = [line for line in result.stderr.splitlines() if re.search(r"Error|unwaited collective", line)]
    return {rank: {**seen, "stderr_problems": problems} for rank, seen in _results(out).items()}


@pytest.fixture(scope="module")
def fsdp_ranks(run_once: Callable[..., Any]) -> dict[int, dict]:
    """One DeferAndFuse run of two ranks on the default chip's smallest host that holds them (each binds one chip;
    ``--chip v6e-4`` would be refused: a TorchTPU v6e host runs 1, 4 or 8 processes): FSDP2 and DTensor, then
    pinned memory and the device count, in the same ranks."""
    return {int(rank): seen for rank, seen in run_once("tpu-dist-fsdp", _fsdp_run).items()}


def test_fsdp2_and_dtensor_on_a_tpu_device_mesh_in_defer_and_fuse(fsdp_ranks: dict[int, dict]) -> None:
    ranks = fsdp_ranks
    assert ranks[0]["local_shard"] == [0.0, 1.0, 2.0, 3.0] and ranks[1]["local_shard"] == [4.0, 5.0, 6.0, 7.0]
    for seen in ranks.values():
        assert seen["full_tensor"] == [float(i) for i in range(8)]
        assert seen["replicated_local"] == [float(i) for i in range(8)]
        assert seen["param_is_dtensor"] == "DTensor" and seen["param_device"] == "tpu:0"
        assert seen["fsdp_losses"] == pytest.approx(seen["plain_losses"], rel=1e-5)
    assert ranks[0]["fsdp_losses"] == ranks[1]["fsdp_losses"]


def test_fsdp2_meta_device_initialisation_draws_every_shard_from_the_device_generator(
    fsdp_ranks: dict[int, dict],
) -> None:
    weight, bias = fsdp_ranks[0]["meta_init"][:2]
    assert fsdp_ranks[0]["meta_init"] == fsdp_ranks[1]["meta_init"]  # one full tensor, whichever rank gathers it
    assert max(map(abs, weight + bias)) <= 8**-0.5  # Linear(8, 16)'s kaiming bound
    assert weight[:64] != weight[64:] and len(set(weight)) == len(weight)  # each shard its own numbers


def test_functional_collectives_return_waitable_results_and_finish_before_the_group_is_destroyed(
    fsdp_ranks: dict[int, dict],
) -> None:
    for seen in fsdp_ranks.values():
        assert seen["async_result"] == ["AsyncCollectiveTensor", [float(i) for i in range(8)]]
        assert seen["async_used"] == [float(i + 1) for i in range(8)]
        assert seen["unwaited_works"] == 0  # DTensor's full_tensor and redistribute waited for theirs
        assert seen["stderr_problems"] == []


def test_pinned_memory_and_one_device_per_process_in_every_rank(fsdp_ranks: dict[int, dict]) -> None:
    assert sorted(fsdp_ranks) == [0, 1]
    for seen in (results["host_memory"] for results in fsdp_ranks.values()):
        # TorchTPU binds each process of a multi-process run to its one chip, seen as tpu:0: on a multi-chip host
        # each of the two ranks counts one device (a CUDA-style "device_count() >= local world" check fails)
        assert seen["device_count"] == 1 and seen["current_device"] == 0
        assert seen["devices_per_rank"] == 0 and seen["enough_devices"] is False
        assert seen["pinned_batches"] == [True, True]
        assert seen["pinned_host"] == [True, [1.0, 1.0, 1.0]]
        assert seen["total"] == [56.0, 64.0]  # every row summed once across both ranks' shards


def test_a_failing_rank_stops_the_others_and_its_exit_code_is_returned(tmp_path: Path) -> None:
    started = time.monotonic()
    result = tpu_agent("run", "--nproc", "2", "--backend", "emulated", str(SCRIPTS / "dist_crash.py"), timeout=120)
    assert result.returncode == 3, result.stderr
    assert re.search(r"rank 1 \(local rank 1, pid \d+\) failed with exit code 3", flat(result.stderr))
    assert time.monotonic() - started < 60  # rank 0 was stopped, not left waiting for its 60 s sleep


def test_a_hanging_collective_times_out_naming_the_op_and_the_missing_rank() -> None:
    result = tpu_agent("run", "--nproc", "2", "--backend", "emulated", str(SCRIPTS / "dist_hang.py"), timeout=120)
    assert result.returncode == 1
    text = flat(result.stderr)
    assert "tpu_dist: all_reduce (collective #2" in text
    assert "timed out after 3 s on rank 0" in text
    assert "did not reach it: rank 1 (last entered broadcast #1)" in text
    assert re.search(r"rank 0 \(local rank 0, pid \d+\) failed with exit code 1", text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_stops_every_rank(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "tpu_agent", "run", "--nproc", "2", "--backend", "emulated", str(SCRIPTS / "dist_sleep.py")],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    pids = []
    deadline = time.monotonic() + 90
    assert process.stdout is not None
    while len(pids) < 2 and time.monotonic() < deadline:
        line = process.stdout.readline()  # the ranks share the pipe: their reports may land on one line
        pids += [int(pid) for pid in re.findall(r"ready rank=\d pid=(\d+)", line)]
    assert len(pids) == 2, process.stderr.read() if process.poll() is not None else "ranks did not start"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "received SIGINT; stopped all ranks" in flat(stderr)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids)


def test_a_rank_that_returns_early_is_named_by_the_peer_waiting_in_a_collective() -> None:
    result = tpu_agent("run", "--nproc", "2", "--backend", "emulated", str(SCRIPTS / "dist_early_exit.py"), timeout=120)
    assert result.returncode == 1, result.stderr
    text = flat(result.stderr)
    assert re.search(
        r"tpu_dist: all_reduce \(collective #2 of group \S+, ranks \[0, 1\]\) on rank 0 failed: rank 1 exited while",
        text,
    )
    assert "Connection closed by peer" in text  # the transport's own words are kept, after the explanation
    assert re.search(r"rank 0 \(local rank 0, pid \d+\) failed with exit code 1", text)


LONE_RANKS = """
import torch, torch.distributed as dist
dist.init_process_group("tpu_dist")
model = torch.nn.Linear(4, 1).to("tpu")
ema = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)  # a host-side optimizer is not the training one
ema.step()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(8, 4, device="tpu")).square().mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


def test_ranks_that_never_average_their_gradients_are_told_they_train_alone(tmp_path: Path) -> None:
    """No DDP, FSDP or all_reduce before the first optimizer step over tpu parameters: each rank trains its own
    model (Hugging Face Trainer does this on tpu, accelerate knowing no backend for it); each rank says so once."""
    (tmp_path / "lone.py").write_text(LONE_RANKS)
    result = tpu_agent("run", "--nproc", "2", "--backend", "emulated", "lone.py", cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    warned = re.findall(r"lone\.py:10: UserWarning: rank (\d) of 2 took its first optimizer step", result.stderr)
    assert sorted(warned) == ["0", "1"], result.stderr[-3000:]
    assert "DistributedDataParallel or FSDP over tpu_dist" in result.stderr
