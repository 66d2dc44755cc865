"""The bundled CUDA project (examples/cuda_ddp) end to end: migrate a copy, then check what is left.

After migration every CUDA-specific reference still in the tree is a reported (unfixed) finding, every
migrated Python file parses, a second run changes nothing, and the migrated training script still trains
on this CPU-only machine (the accelerator target keeps a CPU fallback).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tpu_agent.migrate.engine import build_plan
from tpu_agent.migrate.model import FileKind, FileResult, MigrateOptions, Plan, Target

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cuda_ddp"
# API-level CUDA references (names, strings in calls, env vars, kernels), not prose in comments.
CUDA_REFERENCE = re.compile(
    r"torch\.cuda|\.cuda\(|\.is_cuda|[\"']cuda|[\"']nccl|\bnccl\b|cudnn|\bCUDA_\w+|\bNCCL_\w+|nvidia/cuda|"
    r"\b(?:import|from) (?:flash_attn|triton|xformers|apex|cupy|bitsandbytes)\b|\btriton\.|cpp_extension"
)


def _migrate(tmp: Path, options: MigrateOptions) -> tuple[Plan, Plan]:
    tree = tmp / "cuda_ddp"
    shutil.copytree(EXAMPLE, tree)
    first = build_plan([tree], options)
    for result in first.files:
        if result.migrated_bytes is not None:
            result.path.write_bytes(result.migrated_bytes)
    return first, build_plan([tree], options)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Plan]:
    return _migrate(tmp_path_factory.mktemp("example"), MigrateOptions(jobs=1))


def _code_lines(result: FileResult) -> list[tuple[str, int, str]]:
    """(finding key, line, text) of every code line; notebooks by cell."""
    text = result.path.read_text(encoding="utf-8")
    if result.kind is not FileKind.NOTEBOOK:
        return [("", i, line) for i, line in enumerate(text.splitlines(), 1)]
    out = []
    for number, cell in enumerate(json.loads(text)["cells"], 1):
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            out.extend((f"cell {number}:", i, line) for i, line in enumerate(source.splitlines(), 1))
    return out


def test_example_is_there() -> None:
    assert (EXAMPLE / "train.py").is_file(), "examples/cuda_ddp is part of the repository"


def test_migration_changes_the_project(migrated: tuple[Plan, Plan]) -> None:
    first, _ = migrated
    changed = {Path(f.display_path).name for f in first.changed_files}
    assert {"train.py", "launch.sh", "explore.ipynb"} <= changed
    assert not [f.skipped_reason for f in first.files if f.skipped_reason]


def test_second_run_changes_nothing(migrated: tuple[Plan, Plan]) -> None:
    _, second = migrated
    assert second.changed_files == []
    assert [f for f in second.findings if f.fixed] == []


def test_python_files_parse(migrated: tuple[Plan, Plan]) -> None:
    _, second = migrated
    for result in second.files:
        if result.kind is FileKind.PYTHON:
            ast.parse(result.path.read_bytes(), filename=str(result.path))


def test_every_remaining_cuda_reference_is_reported(migrated: tuple[Plan, Plan]) -> None:
    _, second = migrated
    unreported = []
    for result in second.files:
        if result.kind is FileKind.CUDA_SOURCE:
            assert [f.code for f in result.findings] == ["TPU801"]
            continue
        notebook = result.kind is FileKind.NOTEBOOK
        reported = {(f.message.split(":", 1)[0] + ":" if notebook else "", f.line) for f in result.findings}
        for key, line, text in _code_lines(result):
            code = text.split("  #")[0]
            if code.lstrip().startswith("#") or not CUDA_REFERENCE.search(code):
                continue
            if (key, line) not in reported:
                unreported.append(f"{result.display_path}:{key}{line}: {text.strip()}")
    assert unreported == []


@pytest.mark.slow
def test_migrated_training_still_runs_on_cpu(migrated: tuple[Plan, Plan]) -> None:
    _, second = migrated
    train = next(f.path for f in second.files if f.path.name == "train.py")
    run = subprocess.run(
        [sys.executable, str(train), "--steps", "2", "--amp"],
        cwd=train.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(r"^step 1 loss \d+\.\d{6}$", run.stdout, re.MULTILINE), run.stdout


# Imports the migrated train.py and runs only its distributed setup, which is where one-device-per-process bites.
_SETUP_ONLY = """\
import torch.distributed as dist
import train

rank, local_rank, world = train.setup_distributed()
print(f"rank {rank} of {world} on {train.DEVICE} via {dist.get_backend()}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_migrated_setup_runs_on_every_rank_of_the_tpu_runtime(migrated: tuple[Plan, Plan]) -> None:
    """TorchTPU binds one device per process: rank 1 must get through the migrated set_device (which runs
    off TPU only), and no emptied ``if`` is left behind."""
    _, second = migrated
    train = next(f.path for f in second.files if f.path.name == "train.py")
    text = train.read_text()
    assert 'DEVICE.type != "tpu"' in text and "pass\n" not in text
    driver = train.parent / "setup_only.py"
    driver.write_text(_SETUP_ONLY)
    run = subprocess.run(
        [sys.executable, "-m", "tpu_agent", "run", "--nproc", "2", "--backend", "emulated", str(driver)],
        cwd=train.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # Both ranks share the launcher's stdout, so their lines may interleave: match the reports, not lines.
    lines = sorted(re.findall(r"rank \d+ of \d+ on \S+ via \S+?(?=rank |\n|$)", run.stdout))
    assert lines == ["rank 0 of 2 on tpu via tpu_dist", "rank 1 of 2 on tpu via tpu_dist"], run.stdout


def test_tpu_target_and_unsafe_fixes_also_converge(tmp_path: Path) -> None:
    options = MigrateOptions(target=Target.TPU, unsafe_fixes=True, jobs=1)
    first, second = _migrate(tmp_path, options)
    assert second.changed_files == []
    train = next(f for f in second.files if f.path.name == "train.py").path.read_text()
    assert "GradScaler" in train and "enabled=False" in train
    assert 'backend="tpu_dist"' in train or "backend='tpu_dist'" in train
    assert "set_device" not in train and "pass\n" not in train  # one device per process; no emptied if left
    assert "torch.tpu.get_device_name()" in train
    for result in second.files:
        if result.kind is FileKind.PYTHON:
            ast.parse(result.path.read_bytes())
    assert len(first.findings) >= len(second.findings)
