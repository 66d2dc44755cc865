"""``tpu-agent run`` argument handling: what belongs to tpu-agent and what to the script, and bad options."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_launch_util import flat, tpu_agent, tpu_agent_in_process

ECHO = "import os, sys\nprint(sys.argv[1:], os.environ.get('EXTRA'), os.environ.get('TPU_AGENT_CHIP'))\n"
# ECHO, plus the device count the script sees (which imports torch): one launch checks both tests below
ECHO_AND_COUNT = ECHO + "import torch\nprint(torch.accelerator.device_count())\n"


def _echo_run(workdir: Path) -> list[str]:
    """The output lines of one `tpu-agent run` with tpu-agent options, "--", and the script's own options."""
    (workdir / "echo.py").write_text(ECHO_AND_COUNT)
    # "--" ends tpu-agent's options; everything after SCRIPT, options and "--" included, is the script's
    result = tpu_agent(
        "run",
        "--backend",
        "emulated",
        "--env",
        "EXTRA=yes",
        "--chip",
        "v6e-4",
        "--",
        "echo.py",
        "--nproc",
        "4",
        "--",
        "-x",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()


@pytest.fixture(scope="module")
def echoed(run_once: Callable[..., Any]) -> list[str]:
    return run_once("run-echo", _echo_run)


@pytest.mark.slow
def test_options_after_the_script_belong_to_the_script(echoed: list[str]) -> None:
    assert echoed[-2] == "['--nproc', '4', '--', '-x'] yes v6e-4"


@pytest.mark.slow
def test_the_host_follows_the_chip_slice(echoed: list[str]) -> None:
    from tpu_agent.chips import host_devices, parse_target

    # the table, as activate() sizes the host for one process
    assert [host_devices(parse_target(chip), 1) for chip in ("v6e", "v6e-4", "v5e-8")] == [1, 4, 8]
    # and end to end: the script sees the slice's host through `tpu-agent run --chip`
    assert echoed[-1] == "4"


def test_bad_options_are_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "echo.py").write_text(ECHO)
    monkeypatch.chdir(tmp_path)
    for args, mentions in (
        (["--nproc", "0", "echo.py"], "--nproc"),
        (["--nproc", "1000", "echo.py"], "--nproc 1000: the largest v6e host has 8 TPU devices"),
        (["--chip", "v6e-4", "--nproc", "5", "echo.py"], "--nproc 5: one v6e-4 host has 4 TPU devices"),
        (["--chip", "v7", "--nproc", "17", "--nnodes", "2", "echo.py"], "use --nproc 16 or fewer on one host"),
        # a TorchTPU v6e host runs 1, 4 or 8 processes (its single-host topologies); the default chip is not checked
        (["--chip", "v6e", "--nproc", "2", "echo.py"], "a TorchTPU v6e host runs 1, 4 or 8 processes"),
        (["--chip", "v6e-8", "--nproc", "6", "echo.py"], "use --nproc 1, 4 or 8"),
        (["--nproc", "2", "missing.py"], "can't open file"),  # the default chip is not checked: the next check fails
        (["--chip", "v9", "echo.py"], "v9"),
        (["--eager-mode", "lazy", "echo.py"], "lazy"),
        (["--env", "NOEQUALS", "echo.py"], "NOEQUALS"),
        (["--timeout", "-1", "echo.py"], "--timeout"),
        ([], "SCRIPT"),
    ):
        result = tpu_agent_in_process("run", *args)  # refused before anything launches
        assert result.exit_code == 2, (args, result.stderr)
        assert mentions in flat(result.stderr), (args, result.stderr)


def test_help_documents_the_launcher() -> None:
    result = tpu_agent("run", "--help", env=None)
    text = flat(result.stdout)
    for option in (
        "--nproc",
        "--backend",
        "--chip",
        "--eager-mode",
        "--nnodes",
        "--node-rank",
        "--rdzv-endpoint",
        "--rdzv-backend",
        "--master-port",
        "--timeout",
        "-m",
    ):
        assert option in text
    assert "tpu-agent run --nproc 2" in text


def test_rendezvous_options_reach_torchrun_unchanged() -> None:
    from torch.distributed.run import parse_args

    from tpu_agent.runtime.launcher import command
    from tpu_agent.runtime.options import LaunchTarget, RunOptions

    options = RunOptions(
        nproc=4, nnodes="2", node_rank=1, rdzv_endpoint="host0:29400", rdzv_backend="c10d", master_port=29555
    )
    argv = command(LaunchTarget("train.py", ["--lr", "1"]), options)
    assert argv[1:3] == ["-m", "tpu_agent.runtime.elastic"]
    parsed = parse_args(argv[3:])  # torchrun's own parser, as the agent process uses it
    assert (parsed.nproc_per_node, parsed.nnodes, parsed.node_rank) == ("4", "2", 1)
    assert (parsed.rdzv_endpoint, parsed.rdzv_backend, parsed.master_port, parsed.max_restarts) == (
        "host0:29400",
        "c10d",
        29555,
        0,
    )
    assert parsed.module and parsed.training_script == "tpu_agent.runtime.bootstrap"
    assert parsed.training_script_args == ["train.py", "--lr", "1"]
    single = command(LaunchTarget("pkg.train", ["-x"], is_module=True), RunOptions())
    assert single[1:] == ["-m", "tpu_agent.runtime.bootstrap", "-m", "pkg.train", "-x"]
