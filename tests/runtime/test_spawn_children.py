"""Processes a ``tpu-agent run`` script starts with spawn/forkserver get the ``tpu`` device, as on a TorchTPU host.

Each test runs the real CLI in a subprocess; the scripts start real children (``torch.multiprocessing.spawn``,
a spawn-context DataLoader, a forkserver pool, a fork pool).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from runtime_launch_util import tpu_agent

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


def _run(tmp_path: Path, source: str, timeout: float = 120) -> tuple[int, str, str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    result = tpu_agent("run", "--backend", "emulated", script.name, cwd=tmp_path, timeout=timeout)
    return result.returncode, result.stdout, result.stderr


def test_mp_spawn_children_all_reduce_over_tpu_dist(tmp_path: Path) -> None:
    code, out, err = _run(tmp_path, DIST_WORKER)
    assert code == 0, err[-4000:]
    assert "child 0 sum [3.0, 3.0, 3.0]" in out
    assert "child 1 sum [3.0, 3.0, 3.0]" in out
    assert "parent done" in out


def test_spawn_context_dataloader_feeds_the_tpu(tmp_path: Path) -> None:
    code, out, err = _run(tmp_path, DATALOADER)
    assert code == 0, err[-4000:]
    assert "total [12.0, 16.0]" in out


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
