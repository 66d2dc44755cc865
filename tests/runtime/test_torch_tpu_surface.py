"""Code written for TorchTPU runs unchanged under ``tpu-agent run``: ``import torch_tpu`` and its documented modules,
and the ``tpu`` device in every process the run starts (torch's device-backend autoload), one chip per process.

One real run (:data:`SCRIPT`, a script written from TorchTPU's guides, under ``tpu-agent run --chip v6e-4``) is
shared by the tests that read its result; it starts a plain ``python`` child and its own two-worker
``torch.distributed.run``. The rest is checked in this process, where no run is active.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from runtime_launch_util import SCRIPTS, clean_env, tpu_agent

from tpu_agent.runtime import autoload, run_scope
from tpu_agent.runtime.emulated.state import visible_device_count
from tpu_agent.runtime.envvars import BACKEND_ENV
from tpu_agent.runtime.launcher import build_env
from tpu_agent.runtime.options import RunOptions
from tpu_agent.runtime.select import BackendChoice

SCRIPT = SCRIPTS / "torch_tpu_surface.py"
EMULATED = BackendChoice("emulated", "test")


def _surface_run(directory: Path) -> dict[str, Any]:
    with socket.socket() as sock:  # torchrun's rendezvous port for the script's own two workers
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    logdir = directory / "xprof"
    result = tpu_agent(
        "run", "--backend", "emulated", "--chip", "v6e-4", str(SCRIPT), str(logdir), str(port), timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["logdir"] = str(logdir)
    return out


@pytest.fixture(scope="module")
def surface(run_once: Any) -> dict[str, Any]:
    return run_once("torch-tpu-surface", _surface_run)


@pytest.mark.slow
def test_import_torch_tpu_finds_the_emulations_face_and_its_device(surface: dict[str, Any]) -> None:
    assert Path(surface["torch_tpu_file"]).is_relative_to(run_scope.SURFACE_DIR)
    assert surface["device"] == "tpu"


@pytest.mark.slow
def test_execution_mode_switches_the_emulations_own_eager_mode(surface: dict[str, Any]) -> None:
    # assigned on execution_mode, read on torch.tpu: one setting; Fused Eager leaves the result pending
    assert surface["fused"] == ["EagerMode.DEFER_AND_FUSE", False]
    assert surface["after_synchronize"] is True  # sync.synchronize ran the pending graph
    assert surface["scoped"] == ["EagerMode.DEFER_NEVER", True]  # Strict runs each op at once
    assert surface["restored"] == "EagerMode.DEFER_AND_FUSE"
    assert surface["defer_all"] is False  # INTERNAL_DEFER_ALL defers too
    # the guide's `with em.eager_mode(X):` (a TypeError in the 0.2.0 wheel) scopes the mode as set_eager_mode does
    assert surface["called"] == ["EagerMode.DEFER_AND_FUSE", False]
    assert surface["called_inner_restored"] == "EagerMode.DEFER_AND_FUSE"
    assert surface["called_restored"] == ["EagerMode.DEFER_NEVER", True]
    assert surface["mlir_fused"] == [True, True]  # sync.computation_mlir: the pending graph, lowered
    assert surface["mlir_strict"] == [False, False, True]
    assert surface["module_to_bf16_fused"] == "torch.bfloat16"  # the pending cast ran before torch swapped tensors


@pytest.mark.slow
def test_op_tracer_counts_the_dispatched_aten_ops_and_names_cpu_fallbacks_by_line(surface: dict[str, Any]) -> None:
    assert surface["traced"]["aten.addmm.default"] == 1 and surface["traced"]["aten.linalg_eig.default"] == 1
    assert surface["num_atens"] == sum(surface["traced"].values())
    ((op, site),) = surface["fallbacks"]
    assert op == "aten::linalg_eig" and site.startswith(f"{SCRIPT}:{surface['fallback_line']} ")
    assert "Ops for namespace: 'aten'" in surface["pformat"] and "CPU fallbacks (1 calls" in surface["pformat"]


@pytest.mark.slow
def test_assert_close_reports_the_mismatch_and_tolerances_that_pass(surface: dict[str, Any]) -> None:
    report = surface["mismatch"]
    assert "Mismatched elements: 1 / 4 (25.0%)" in report
    assert "Greatest absolute difference: 0.3 at index (2,)" in report
    assert "atol=0.356 with rtol=0.001" in report and "rtol=0.12 with atol=0.001" in report  # 1.2 x the least


@pytest.mark.slow
def test_the_profiler_writes_an_xprof_session_that_diagnose_reads(surface: dict[str, Any]) -> None:
    from tpu_agent.profile.api import diagnose

    (xplane,) = Path(surface["logdir"]).glob("plugins/profile/*/*.xplane.pb")
    document = diagnose(Path(surface["logdir"])).to_dict()
    assert document["step_time"]["count"] == 3  # the three optimizer steps of the profiled loop
    assert any(op["name"] == "aten::addmm" for op in document["ops"]), xplane


@pytest.mark.slow
def test_processes_the_script_starts_get_the_device_with_one_chip_each(surface: dict[str, Any]) -> None:
    assert surface["lone_device_count"] == 4  # a lone process counts the v6e-4 host's chips
    assert surface["python_child"] == "tpu:0 4"  # a plain `python` child of the run has the device too
    # the script's own torchrun: every worker has the device and sees its one chip as tpu:0
    assert surface["torchrun_workers"] == ["worker 0 1 tpu:0", "worker 1 1 tpu:0"], surface["torchrun_stderr"]


def test_the_autoload_entry_point_is_declared_and_does_nothing_outside_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    points = importlib.metadata.entry_points(group="torch.backends")
    assert any(point.value == "tpu_agent.runtime.autoload:load" for point in points)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    autoload.load()  # what `import torch` called in this process: no device was registered
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"
    from tpu_agent.runtime import api

    assert api._active is None


@pytest.mark.parametrize(
    ("env", "seen"),
    [({}, 4), ({"LOCAL_WORLD_SIZE": "2"}, 1), ({"TPU_VISIBLE_DEVICES": "3"}, 1), ({"TPU_VISIBLE_DEVICES": "0,1"}, 2)],
)
def test_a_process_sees_one_chip_when_it_is_one_of_several(env: dict[str, str], seen: int) -> None:
    assert visible_device_count(4, env) == seen


def test_the_run_puts_the_face_on_the_path_only_where_torch_tpu_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "environ", clean_env(PYTHONPATH="/somewhere"))
    env = build_env(EMULATED, RunOptions())
    assert env["PYTHONPATH"].split(os.pathsep) == ["/somewhere", str(run_scope.SURFACE_DIR)]
    assert build_env(EMULATED, RunOptions(env={"PYTHONPATH": env["PYTHONPATH"]}))["PYTHONPATH"] == env["PYTHONPATH"]
    (tmp_path / "torch_tpu").mkdir()  # an installed torch_tpu is never shadowed
    (tmp_path / "torch_tpu" / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    env = build_env(EMULATED, RunOptions())
    assert env["PYTHONPATH"] == "/somewhere" and env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    kept_autoload = build_env(EMULATED, RunOptions(env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}))  # the user's choice
    assert kept_autoload["PYTHONPATH"] == "/somewhere" and kept_autoload["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "1"


def test_doctor_says_what_import_torch_tpu_gives_a_run_and_that_autoload_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runtime_launch_util import tpu_agent_in_process

    monkeypatch.delenv("TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS", raising=False)
    result = tpu_agent_in_process("doctor", "--format", "json")
    assert result.exit_code == 0, result.output
    surface = json.loads(result.output)["torch_tpu_surface"]
    assert surface["import_torch_tpu"].startswith("the emulation's face of torch_tpu (follows torch_tpu 0.2.0")
    assert surface["newest"].startswith("torch_tpu 0.3.0 on PyPI, guide https://torchtpu.readthedocs.io")
    assert surface["legacy_device_apis"].startswith("raise RuntimeError from user code")
    assert surface["autoload"].startswith("installed")
    # the switch the wheel reads turns the errors into warnings
    text = tpu_agent_in_process("doctor", TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS="1").output
    assert "legacy APIs warn once (TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1)" in " ".join(text.split())


def test_lookup_api_answers_torch_tpu_names_from_the_surface_itself() -> None:
    from tpu_agent.plugins.api_lookup import EMULATED, lookup, surface_rows

    rows = {row.tpu: row for row in surface_rows(run_scope.SURFACE_DIR / "torch_tpu")}
    assert {
        "torch_tpu.api.tpu_device",
        "torch_tpu._loader.load",
        "torch_tpu._internal.execution_mode.eager_mode",  # a module property, named in __all__
        "torch_tpu._internal.execution_mode.set_eager_mode",
        "torch_tpu._internal.utils.utils.OpTracer",
        "torch_tpu._internal.profiler.xprof_trace_handler",
        "torch_tpu._internal.sync.sync.synchronize",
    } <= set(rows)
    assert all(row.status == EMULATED[0] and row.reference.endswith(".py") for row in rows.values())
    (best,) = lookup("OpTracer", limit=1)
    assert best.tpu == "torch_tpu._internal.utils.utils.OpTracer" and "Records the ops" in best.note


def test_lookup_api_answers_torch_tpu_and_backends_names_with_the_legacy_calls_marked_internal() -> None:
    from tpu_agent.plugins.api_lookup import lookup

    (legacy,) = lookup("torch.tpu.is_available", limit=1)
    assert legacy.tpu == "torch.tpu.is_available"
    assert "raises RuntimeError" in legacy.note and "use torch.accelerator.is_available" in legacy.note
    names = [row.tpu for row in lookup("allow_excess_precision", limit=2)]
    assert set(names) == {"torch.tpu.allow_excess_precision", "torch.backends.tpu.allow_excess_precision"}
    (stats,) = lookup("_get_cache_stats", limit=1)
    assert stats.tpu == "torch.tpu._get_cache_stats" and stats.reference.endswith("/compilation_cache.py")
    (mode,) = lookup("torch.tpu.eager_mode", limit=1)
    assert "with em.eager_mode(X):" in mode.note  # the guide's call form is part of the surface


@pytest.mark.parametrize(
    ("argv", "itself"),
    [
        ([sys.executable, "-m", "tpu_agent.runtime.bootstrap", "train.py"], True),  # a rank: activates after its checks
        ([sys.executable, "-u", "-m", "tpu_agent.runtime.bootstrap", "-m", "pkg"], True),  # a rank under torchrun
        ([sys.executable, "-m", "tpu_agent.runtime.elastic", "--nproc-per-node", "2"], True),  # the agent
        ([sys.executable, "-m", "torch.distributed.run", "train.py"], False),  # the script's own torchrun
        ([sys.executable, "-c", "from multiprocessing.spawn import spawn_main", "--multiprocessing-fork"], False),
    ],
)
def test_autoload_leaves_the_runs_own_processes_alone(argv: list[str], itself: bool) -> None:
    # torch may be imported in them before their own code runs (a sitecustomize importing torch)
    assert run_scope.runs_itself(argv) is itself
