"""Processes a ``tpu-agent run`` script starts with spawn/forkserver get the ``tpu`` device, as on a TorchTPU host
(torch's device-backend autoload calls :func:`tpu_agent.runtime.autoload.load` in every process of the run).

Each test runs the real CLI in a subprocess; the scripts start real children (``torch.multiprocessing.spawn``,
a spawn-context DataLoader, a forkserver pool, a fork pool).
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from runtime_launch_util import clean_env, tpu_agent

from tpu_agent.profile.layout import raw_dir
from tpu_agent.profile.load import load_raw
from tpu_agent.runtime import events
from tpu_agent.runtime.events import EVENTS_DIR_ENV

DIST_WORKER = """
    import socket
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def worker(index, port):
        x = torch.full((3,), float(index + 1), device=torch.device("tpu"))
        dist.init_process_group("tpu_dist", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=index)
        dist.all_reduce(x)
        print(f"child {index} sum {x.cpu().tolist()}", flush=True)
        weight = torch.nn.Parameter(x.clone())
        optimizer = torch.optim.SGD([weight], lr=0.1)
        for _ in range(3):  # steps for the event log
            (weight * 2).sum().backward()
            dist.all_reduce(weight.grad)
            optimizer.step()
        dist.destroy_process_group()

    if __name__ == "__main__":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        mp.spawn(worker, nprocs=2, args=(port,))
        print("parent done")
"""

DATALOADER = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if __name__ == "__main__":
        data = TensorDataset(torch.arange(8, dtype=torch.float32).reshape(4, 2))
        loader = DataLoader(data, batch_size=2, num_workers=1, multiprocessing_context="spawn")
        total = torch.zeros(2, device="tpu")
        for (batch,) in loader:
            assert batch.device.type == "cpu"
            total += batch.to("tpu").sum(0)
        print("total", total.cpu().tolist())
"""

CHILD_RAISES = """
    import torch
    import torch.multiprocessing as mp

    def worker(index):
        torch.ones(1, device="tpu")
        raise ValueError(f"boom in child {index}")

    if __name__ == "__main__":
        mp.spawn(worker, nprocs=1)
"""

POOLS = """
    import multiprocessing
    import torch

    def on_tpu(value):
        return float((torch.tensor([value], device="tpu") * 2).cpu().item())

    if __name__ == "__main__":
        on_tpu(0.0)  # the parent's device is in use before the fork
        for method in ("fork", "forkserver"):
            with multiprocessing.get_context(method).Pool(1) as pool:
                print(method, pool.map(on_tpu, [1.0, 2.0]))
"""


def _run(tmp_path: Path, source: str, timeout: float = 120, **env: str) -> tuple[int, str, str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    result = tpu_agent("run", "--backend", "emulated", script.name, cwd=tmp_path, timeout=timeout, env=clean_env(**env))
    return result.returncode, result.stdout, result.stderr


def test_mp_spawn_children_all_reduce_over_tpu_dist(tmp_path: Path) -> None:
    """The workers compute and log: each in a file of its own, which the profile takes as the ranks."""
    raw = raw_dir(tmp_path / "logdir")
    code, out, err = _run(tmp_path, DIST_WORKER, **{EVENTS_DIR_ENV: str(raw)})
    assert code == 0, err[-4000:]
    assert "child 0 sum [3.0, 3.0, 3.0]" in out
    assert "child 1 sum [3.0, 3.0, 3.0]" in out
    assert "parent done" in out

    logs = events.read_logs(raw)
    assert [(log.rank, log.pid is None) for log in logs] == [(0, True), (0, False), (0, False)]
    argvs = []
    for log in logs:  # one process per file: one header, steps in order
        (run_info,) = events.iter_kind(log.events, events.RunInfo)
        argvs.append(getattr(run_info, "argv", None))
        steps = [e.step for e in events.iter_kind(log.events, events.StepMarker)]
        assert steps == sorted(steps)
    # a worker activates when it first imports torch (torch's backend autoload), which is while multiprocessing
    # re-imports __main__ with the parent's argv restored: its header names the script as the parent's does
    assert argvs[0] == ["script.py"] and argvs[1][0].endswith("script.py") and len(argvs) == 3
    rank_log, *workers = logs
    assert [len(list(events.iter_kind(w.events, events.Collective))) for w in workers] == [4, 4]
    assert not list(events.iter_kind(rank_log.events, events.Collective))

    model = load_raw(raw)
    assert sorted(model.ranks) == [0, 1] and model.config.world_size == 2
    assert model.config.script_args == []  # the rank's argv, not the worker interpreter's
    assert all(len(rank.steps) == 3 for rank in model.ranks.values())
    assert "which rank 0 started and which ran the steps" in model.ranks[1].warnings[0]
    # had the rank run steps of its own, its workers would be named, not mixed in
    shutil.copyfile(workers[0].path, rank_log.path)
    mixed = load_raw(raw)
    assert list(mixed.ranks) == [0] and len(mixed.ranks[0].steps) == 3
    assert sum(w.path.name in warning for w in workers for warning in mixed.ranks[0].warnings) == 2


def test_spawn_context_dataloader_feeds_the_tpu(tmp_path: Path) -> None:
    """The worker logs beside the rank; having run no steps, the profile leaves it out."""
    raw = tmp_path / "raw"
    code, out, err = _run(tmp_path, DATALOADER, **{EVENTS_DIR_ENV: str(raw)})
    assert code == 0, err[-4000:]
    assert "total [12.0, 16.0]" in out
    logs = events.read_logs(raw)
    assert [log.pid is None for log in logs] == [True, False]
    assert all(len(list(events.iter_kind(log.events, events.RunInfo))) == 1 for log in logs)
    model = load_raw(raw)
    assert list(model.ranks) == [0] and model.ranks[0].events == logs[0].events and not model.ranks[0].warnings


def test_child_exception_fails_the_run_with_its_traceback(tmp_path: Path) -> None:
    code, _, err = _run(tmp_path, CHILD_RAISES, timeout=90)
    assert code != 0
    assert "ProcessRaisedException" in err
    assert "ValueError: boom in child 0" in err
    assert "in worker" in err  # the child's own frame, not only the parent's


def test_fork_and_forkserver_pools_use_the_device(tmp_path: Path) -> None:
    code, out, err = _run(tmp_path, POOLS)
    assert code == 0, err[-4000:]
    assert "fork [2.0, 4.0]" in out
    assert "forkserver [2.0, 4.0]" in out


@pytest.mark.slow  # three interpreters importing torch in a row: ~20 s
def test_grandchildren_are_activated(tmp_path: Path) -> None:
    """A spawned worker's own spawn-context children (its DataLoader workers) get the device too."""
    source = """
        import multiprocessing
        import torch

        def leaf(queue):
            queue.put(float(torch.ones(1, device="tpu").sum().cpu().item()))

        def middle(queue):
            child = multiprocessing.get_context("spawn").Process(target=leaf, args=(queue,))
            child.start()
            child.join()

        if __name__ == "__main__":
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            process = ctx.Process(target=middle, args=(queue,))
            process.start()
            print("leaf", queue.get(timeout=60))
            process.join()
    """
    code, out, err = _run(tmp_path, source)
    assert code == 0, err[-4000:]
    assert "leaf 1.0" in out
