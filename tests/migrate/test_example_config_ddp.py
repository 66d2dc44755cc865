"""The second bundled example (examples/cuda_config_ddp): devices and backends come from a config dataclass and
argparse, so only value-following rewrites can port it. Migrated with no hand edits, it must parse, migrate to
itself, and train on the emulated ``tpu`` device in 1 and 2 processes."""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tpu_agent.migrate.api import apply, plan
from tpu_agent.migrate.model import MigrateOptions, Target

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cuda_config_ddp"
# The ranks share the launcher's stdout and a rank's text and its newline can land apart, so one rank's report
# may run into another's ("...on tpurank 1 done..."): match the reports, not whole lines.
DONE = re.compile(r"rank (\d) done: final loss (\d+\.\d+|nan|inf) on tpu")


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Target], Path]:
    """The example migrated once per target (on first use), shared by the module's tests."""

    @functools.cache
    def tree(target: Target) -> Path:
        return _migrated(tmp_path_factory.mktemp(f"config-ddp-{target.value}"), target)

    return tree


def _migrated(tmp: Path, target: Target) -> Path:
    source = tmp / "src"
    shutil.copytree(EXAMPLE, source)
    out = tmp / "out"
    first = plan([source], MigrateOptions(target=target, jobs=1))
    apply(first, output_dir=out)
    again = plan([out], MigrateOptions(target=target, jobs=1))
    assert not again.changed_files, [f.display_path for f in again.changed_files]
    for path in out.glob("*.py"):
        ast.parse(path.read_text())
    return out


def _run(tree: Path, nproc: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_agent",
            "run",
            "--backend",
            "emulated",
            "--nproc",
            str(nproc),
            "train.py",
            "--steps",
            "3",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
        # the run's settings come from its command line, not from what an earlier test left in this process
        env={k: v for k, v in os.environ.items() if not k.startswith(("TPU_AGENT_", "TORCH_TPU_"))},
    )


def test_config_values_are_followed_to_their_uses(migrated: Callable[[Target], Path]) -> None:
    out = migrated(Target.ACCELERATOR)
    config = (out / "config.py").read_text()
    assert "device: str = DEVICE.type" in config
    assert "dist_backend: str = torch.distributed.get_default_backend_for_device(DEVICE)" in config
    assert 'choices=["cpu", DEVICE.type]' in config
    dist_utils = (out / "dist_utils.py").read_text()
    assert 'if cfg.device == DEVICE.type != "cpu":' in dist_utils  # False on a CPU-only machine, as before
    assert "device_id=torch.device(DEVICE.type, torch.accelerator.current_device_index())" in dist_utils
    train = (out / "train.py").read_text()
    for line in train.splitlines():  # a rank is a device index only off TPU, which binds one device per process
        if "local_rank)" in line and "setup_distributed(cfg)" not in line:
            assert 'if DEVICE.type in ("cpu", "tpu") else' in line, line
    assert "torch.nn.attention.sdpa_kernel" in (out / "model.py").read_text()


@pytest.mark.slow
def test_migrated_example_trains_in_one_emulated_process(migrated: Callable[[Target], Path]) -> None:
    result = _run(migrated(Target.ACCELERATOR), 1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [rank for rank, _ in DONE.findall(result.stdout)] == ["0"], result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("target", [Target.ACCELERATOR, Target.TPU], ids=["accelerator", "tpu"])
def test_migrated_example_trains_on_two_emulated_ranks(migrated: Callable[[Target], Path], target: Target) -> None:
    result = _run(migrated(target), 2)
    assert result.returncode == 0, result.stderr[-3000:]
    done = dict(DONE.findall(result.stdout))
    assert sorted(done) == ["0", "1"], result.stdout[-3000:]
    assert done["0"] == done["1"]  # the all-reduced loss agrees across ranks
    assert "trains its own copy" not in result.stderr  # DDP averaged the gradients before the first step
