"""The emulated TorchTPU device, exercised through real scripts in fresh processes (activation is process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_launch_util import clean_env

from tpu_agent.runtime.events import (
    Compile,
    Flush,
    GraphBreak,
    HostSync,
    MemorySample,
    OpBatch,
    StepMarker,
    read_events,
)

pytestmark = pytest.mark.slow  # every test runs a fresh torch process

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, env: dict[str, str] | None = None, expect_json: bool = True) -> dict | str:
    full_env = clean_env()
    full_env["PYTHONPATH"] = str(REPO)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=240,
        cwd=SCRIPTS,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last) if expect_json else last


def line_of(script: str, marker: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, text in enumerate(lines, start=1) if f"# LINE {marker}" in text)


def _basics(directory: Path) -> list:
    checkpoint = directory / "model.pt"
    return [run_script("emulated_basics.py", "v5e", str(checkpoint)), str(checkpoint)]


@pytest.fixture(scope="module")
def basics(run_once: Callable[..., Any]) -> tuple[dict, Path]:
    out, checkpoint = run_once("emulated-basics", _basics)
    return out, Path(checkpoint)


def test_device_and_accelerator_api(basics: tuple[dict, Path]) -> None:
    out, _ = basics
    assert out["accelerator"] == {"type": "tpu", "available": True, "device_count": 1, "current_index": 0}
    assert out["is_tpu"] == {"is_tpu": True, "device": "tpu:0", "tpu_method_moves": True}
    assert out["factories"] == {"arange": [0, 1, 2, 3, 4], "eye_rows": 2, "zeros_device": "tpu"}
    assert out["eager_mode"] == "DEFER_NEVER"
    assert out["amp_dtypes"] == 20


def test_chip_properties_follow_the_chip_table(basics: tuple[dict, Path]) -> None:
    out, _ = basics
    assert out["name"] == "TPU v5e"
    assert out["props"] == {"name": "TPU v5e", "total_memory": 16 * 1024**3}


def test_torchtpu_rules_for_legacy_calls_and_device_index(basics: tuple[dict, Path]) -> None:
    out, _ = basics
    assert out["legacy"] == {
        "type": "RuntimeError",
        "message": "is_available is internal to TorchTPU and can only be called by the PyTorch framework (torch and "
        "torch_tpu). Use torch.accelerator.is_available instead.",
    }
    assert out["set_device"] == {
        "type": "ValueError",
        "message": "Cannot set TPU device to index 1, current process is bound to device index 0. "
        "Changing the active TPU device within a process is not supported.",
    }
    assert out["stream"]["type"] == "NotImplementedError"


def test_views_alias_and_device_errors(basics: tuple[dict, Path]) -> None:
    out, _ = basics
    assert out["alias"] == [40.0, 50.0, 60.0, 70.0]
    assert out["mixed"]["type"] == "RuntimeError"
    assert out["mixed"]["message"].startswith("Expected all tensors to be on the same device")
    assert out["numpy"] == {
        "type": "TypeError",
        "message": "can't convert tpu:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.",
    }
    assert out["repr"] == "tensor([1.5000, 2.0000], device='tpu:0')"


def test_inplace_shape_ops_device_context_and_fused_attention(basics: tuple[dict, Path]) -> None:
    out, _ = basics
    assert out["inplace_meta"] == {
        "unsqueezed_shape": [1, 3],
        "unsqueezed_data_shape": [1, 3],
        "transposed_shape": [3, 2],
        "transposed_stride": [1, 3],
    }
    assert out["device_context"] == "tpu:0"
    assert out["sdpa_bf16_inputs"] is True  # fused attention sees bf16-rounded q/k/v at default precision


def test_memory_stats_track_allocations(basics: tuple[dict, Path]) -> None:
    out, _ = basics
    assert out["memory_delta"] == 4 * 1024 * 1024
    assert out["memory_freed"] == 0
    assert out["peak_at_least"] is True


def test_optimizers_take_the_foreach_path_and_foreach_writes_advance_versions(basics: tuple[dict, Path]) -> None:
    foreach = basics[0]["foreach"]
    assert foreach["adamw_path"] == "foreach"
    assert foreach["version_advanced"] is True
    assert "modified by an inplace operation" in foreach["autograd_sees_write"]["message"]


def test_precision_remap_and_unsupported_ops(basics: tuple[dict, Path]) -> None:
    out, _ = basics
    assert out["matmul_precision"] == "medium"
    assert out["bad_precision"]["type"] == "ValueError"
    assert out["unsupported"] == {
        "type": "NotImplementedError",
        "message": "'aten::linalg_eig' is not implemented for TPU. Please file a feature request",
    }
    assert out["antialias"] == {  # torchvision v2's resize default; not implemented for tpu (public bug notes)
        "type": "NotImplementedError",
        "message": "'aten::_upsample_bilinear2d_aa' is not implemented for TPU. Please file a feature request",
    }
    assert out["complex32"] == {
        "type": "NotImplementedError",
        "message": "TorchTPU does not yet support dtype complex32",
    }


def test_out_dtype_matmuls_and_the_excess_precision_switch(basics: tuple[dict, Path]) -> None:
    """torch.bmm(bf16, bf16, out_dtype=float32) runs on tpu (torch has CUDA kernels only) and is the f32 product;
    torch.backends.tpu.allow_excess_precision (the notebook's spelling) is torch.tpu's setting, False by default."""
    out, _ = basics
    assert out["bmm_out_dtype"] == ["torch.float32", True]
    assert out["mm_out_dtype"] == "torch.float32"
    assert out["excess_precision"] == [False, True, False]


def test_excess_precision_starts_from_xla_flags() -> None:
    from tpu_agent.runtime.emulated.backends_tpu import excess_precision_from_xla_flags

    assert excess_precision_from_xla_flags(None) is None
    assert excess_precision_from_xla_flags("--xla_dump_to=/tmp/x --xla_allow_excess_precision") is True
    assert (
        excess_precision_from_xla_flags("--xla_allow_excess_precision=true --xla_allow_excess_precision=false") is False
    )
    # an unbalanced quote in another flag is read word by word, not a start-up crash
    assert excess_precision_from_xla_flags("--xla_dump_to=/tmp/bob's --xla_allow_excess_precision") is True


def test_checkpoints_load_with_torch_defaults(basics: tuple[dict, Path]) -> None:
    out, checkpoint = basics
    assert out["load_default"] == {"device": "tpu:0", "equal": True}
    assert out["load_map_tpu"] == "tpu:0"
    assert out["load_cpu_ckpt_to_tpu"] == "tpu:0"
    # A CPU-only process without the emulation restores the same checkpoint with weights_only defaults.
    code = (
        f"import torch, json; d = torch.load(r'{checkpoint}', map_location='cpu');"
        "print(json.dumps([str(d['model']['weight'].device), list(d['model']['weight'].shape), d['step']]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["cpu", [2, 3], 3]


def test_autocast_policy(basics: tuple[dict, Path]) -> None:
    assert basics[0]["autocast"] == {
        "linear": "torch.bfloat16",
        "mm": "torch.bfloat16",
        "loss": "torch.float32",
        "relu": "torch.float32",
        "default": "torch.bfloat16",
        "grad": "torch.float32",
    }


# Every training run of the tests below, in one process (each fresh process pays the torch import): run i trains
# 5 steps, steps 5i..5i+4 of the event log. Eager modes are switched in-process; the environment switches that
# select them at activation are tested by the debug and DeferAndFuse tests.
TRAINING_RUNS = (
    "cpu:foreach:highest",
    "tpu:foreach:highest",
    "cpu:fused:highest",
    "tpu:fused:highest",
    "cpu:fused:medium",
    "tpu:fused:medium",
    "tpu:foreach:medium:DEFER_NEVER",
    "tpu:foreach:medium:DEFER_AND_FUSE",
    "tpu:foreach:medium:DEFER_NEVER_AND_LAUNCH_BLOCKING",
)


def _with_events(script: str, *args: str) -> Callable[[Path], list]:
    """A :func:`run_once` computation: ``script``'s output and the folder of its event log."""

    def compute(directory: Path) -> list:
        return [run_script(script, *args, env={"TPU_AGENT_EVENTS_DIR": str(directory)}), str(directory)]

    return compute


@pytest.fixture(scope="module")
def training(run_once: Callable[..., Any]) -> tuple[dict, list]:
    out, events_dir = run_once("emulated-training", _with_events("emulated_train.py", *TRAINING_RUNS))
    return out, read_events(Path(events_dir))[0]


@pytest.mark.parametrize("optimizer_kind", ["foreach", "fused"])
def test_adamw_training_matches_cpu_exactly_at_highest(optimizer_kind: str, training: tuple[dict, list]) -> None:
    out, events = training
    assert out[f"tpu:{optimizer_kind}:highest"] == out[f"cpu:{optimizer_kind}:highest"]
    # every run steps an optimizer: 5 step ends per run, each with the ops of its step and a memory sample
    ends = [e for e in events if isinstance(e, StepMarker) and e.phase == "end"]
    assert [e.step for e in ends] == list(range(5 * len(TRAINING_RUNS))) and {e.source for e in ends} == {"optimizer"}
    first = 5 * TRAINING_RUNS.index(f"tpu:{optimizer_kind}:highest")
    batches = [e for e in events if isinstance(e, OpBatch)]
    tpu_steps = [b for b in batches if b.step is not None and first < b.step < first + 5]
    assert len(tpu_steps) == 4 and all(b.count == sum(b.by_name.values()) for b in tpu_steps)
    assert all(("aten.addmm.default" in b.by_name or "aten.mm.default" in b.by_name) for b in tpu_steps)
    samples = [e for e in events if isinstance(e, MemorySample) and e.step is not None and first <= e.step < first + 5]
    assert samples and samples[-1].peak_bytes >= samples[-1].allocated_bytes > 0


def test_default_precision_rounds_matmul_inputs_to_bf16(training: tuple[dict, list]) -> None:
    out, events = training
    assert out["tpu:fused:medium"] != out["cpu:fused:medium"]
    for tpu_loss, cpu_loss in zip(out["tpu:fused:medium"], out["cpu:fused:medium"], strict=True):
        assert abs(tpu_loss - cpu_loss) <= 1.6e-2 * abs(cpu_loss) + 1e-5
    # deferral changes when ops run, never what they compute
    strict = out["tpu:foreach:medium:DEFER_NEVER"]
    assert strict != out["cpu:fused:medium"]  # the rounding is in force in every mode compared here
    for mode in ("DEFER_AND_FUSE", "DEFER_NEVER_AND_LAUNCH_BLOCKING"):
        assert out[f"tpu:foreach:medium:{mode}"] == strict
    fused = 5 * TRAINING_RUNS.index("tpu:foreach:medium:DEFER_AND_FUSE")
    flushed = [e.step for e in events if isinstance(e, Flush) and e.cause == "item"]
    # it deferred: each loss.item() (read after its step's end) flushed a pending graph
    assert [step for step in flushed if fused < step <= fused + 5] == list(range(fused + 1, fused + 6))


def test_defer_and_fuse_flushes_with_causes_and_user_lines(tmp_path: Path) -> None:
    out = run_script("emulated_deferred.py", env={"TPU_AGENT_EVENTS_DIR": str(tmp_path)})
    assert out["pending"] is True
    assert out["strict_inside"] is True and out["mode_after"] == "DEFER_AND_FUSE"
    assert "index out of range" in out["error"]
    assert f"emulated_deferred.py:{line_of('emulated_deferred.py', 'failed') - 2}" in out["error"]
    events = read_events(tmp_path)[0]
    flushes = [(e.cause, e.site.line if e.site else None) for e in events if isinstance(e, Flush)]
    script = "emulated_deferred.py"
    assert ("item", line_of(script, "item")) in flushes
    assert ("print", line_of(script, "print")) in flushes
    assert ("bool", line_of(script, "bool")) in flushes
    assert ("cpu", line_of(script, "failed")) in flushes
    assert any(cause == "collective" for cause, _ in flushes)
    first = next(e for e in events if isinstance(e, Flush))
    assert first.graph_ops >= 3 and len(first.graph_hash) == 16
    syncs = {e.op for e in events if isinstance(e, HostSync)}
    assert {"item", "print", "cpu", "bool"} <= syncs


def test_defer_and_fuse_inplace_writes_read_back_as_in_strict_mode() -> None:
    out = run_script("emulated_inplace.py")
    assert out["accumulate_into_zeros"]["strict"] == [6.0]
    for case, values in out.items():
        assert values["pending_ops"] > 0, f"{case}: nothing was deferred, so DeferAndFuse went untested"
        assert values["defer_host"] == values["strict"], f"{case}: host read under DeferAndFuse differs from Strict"
        assert values["defer_unwrap"] == values["strict"], f"{case}: unwrap() under DeferAndFuse differs from Strict"


def test_debug_mode_names_the_op_and_line_that_made_nan() -> None:
    out = run_script("emulated_debug.py", env={"TORCH_TPU_LAUNCH_BLOCKING": "1"})
    assert out["mode"] == "DEFER_NEVER_AND_LAUNCH_BLOCKING"
    assert out["masked_ok"] is True  # a deliberate -inf fill is not an error
    assert "aten.log.default produced NaN" in out["error"]
    assert f"emulated_debug.py:{line_of('emulated_debug.py', 'nan')}" in out["error"]


@pytest.fixture(scope="module")
def compiled(run_once: Callable[..., Any]) -> tuple[dict, list]:
    """One compiling run (Dynamo's import alone costs seconds): its output and its event log."""
    out, events_dir = run_once("emulated-compile", _with_events("emulated_compile.py"))
    return out, read_events(Path(events_dir))[0]


def test_compile_backend_rules_and_events(compiled: tuple[dict, list]) -> None:
    out, events = compiled
    assert out["compiled_device"] == "tpu:0" and out["matches_eager"] is True
    assert out["recompiled_shape"] == [4]  # a (8, 4) input recompiles and still reduces over dim 0
    assert out["default_backend_device"] == "tpu:0"  # no backend= with tpu inputs means "tpu"
    assert out["grad"] == "tpu:0"
    # a gradient for an output AOTAutograd traced as a plain tensor reaches the compiled backward as its CPU data
    assert out["tangent_coercion"] == {
        "to_plain": ["Tensor", "cpu", [1.0, 1.0]],
        "to_tpu_is_itself": True,
        "to_other_is_refused": True,
    }
    assert out["dynamic"]["type"] == "NotImplementedError"
    assert "does not support torch.compile(..., dynamic=True" in out["dynamic"]["message"]
    assert out["mode"] == {"type": "TypeError", "message": "Unexpected keyword arguments: {'mode': 'max-autotune'}"}
    assert out["options"] == {
        "type": "TypeError",
        "message": "Unexpected keyword arguments: {'triton.cudagraphs': True}",
    }
    assert "backend='inductor') on TPU is experimental" in out["inductor"]["message"]
    compiles = [e for e in events if isinstance(e, Compile) and e.function == "f"]
    assert [c.is_recompile for c in compiles] == [False, True]
    assert "size mismatch at index 0. expected 4, actual 8" in compiles[1].reason
    assert all(not isinstance(e, GraphBreak) or e.site is not None for e in events)


def test_inference_mode_under_compile_is_refused_with_no_grad_as_the_way(compiled: tuple[dict, list]) -> None:
    out = compiled[0]
    assert (
        "torch.inference_mode() is not supported in or around a function compiled" in out["inference_mode"]["message"]
    )
    assert "use torch.no_grad() instead" in out["inference_mode"]["message"]
    assert out["no_grad"] is True


def test_cache_stats_count_the_executables_built(compiled: tuple[dict, list]) -> None:
    """torch.tpu._get_cache_stats(): a first op (Strict), graph (DeferAndFuse) or compiled call is a request that
    misses, the same again a warm hit, a new shape a miss; per-entry reads and compile times are kept, and a
    cleared cache misses again (what vLLM's TorchTPU backend reads each step to notice recompiles)."""
    requests = compiled[0]["cache_requests"]
    for unit in ("strict", "defer_and_fuse", "compile"):
        assert requests[unit] == [[1, 0], [1, 1], [1, 0]], unit
    assert requests["entries_read"] and requests["compiled_entry_timed"] and requests["misses"]
    assert requests["after_clear"] == [1, 0]
    assert requests["excess_precision_changed"] == [1, 0]  # TorchTPU recompiles when the setting changes


def test_a_compiled_training_step_trains(compiled: tuple[dict, list]) -> None:
    """Forward, backward and optimizer step in one compiled function: the backward's wrapper (which keeps a device
    error in a thread-local) is not traced, so Dynamo's guards never see that state change in the frame."""
    losses = compiled[0]["train_losses"]
    assert len(losses) == 3 and losses[2] < losses[0]


def test_dynamo_is_imported_only_by_runs_that_compile(compiled: tuple[dict, list]) -> None:
    out, _ = compiled
    # activation, eager ops and an eager collective did not import Dynamo; a compiled function's collective still ran
    assert out["dynamo_before_compile"] is False and out["compiled_collective"] == [3.0, 3.0, 3.0, 3.0]


def test_activation_refuses_a_foreign_privateuse1_backend() -> None:
    assert run_script("emulated_refuse.py", expect_json=False) == "REFUSED privateuse1-taken REFUSED"


def test_events_and_streams_are_host_timed_flush_triggers(tmp_path: Path) -> None:
    out = run_script("emulated_streams.py", env={"TPU_AGENT_EVENTS_DIR": str(tmp_path)})
    assert out["classes"] == {"is_tpu_event": True, "is_torch_event": True, "device": "tpu"}
    assert out["recorded_work_ran"] is True and out["end_work_ran"] is True
    assert isinstance(out["elapsed"], float) and 50.0 <= out["elapsed"] < 10_000.0  # a 50 ms host sleep lies between
    assert out["query"] is True
    assert out["untimed"] == {
        "type": "ValueError",
        "message": "Both events must be created with argument 'enable_timing=True'.",
    }
    assert out["unrecorded"] == {
        "type": "ValueError",
        "message": "Both events must be recorded before calculating elapsed time.",
    }
    assert out["other_index"]["type"] == "ValueError" and "bound to device index 0" in out["other_index"]["message"]
    assert out["inside"] == "<torch.tpu.TpuStream>"
    assert out["streams"] == {
        "current_is_tpu_stream": True,
        "new_is_tpu_stream": True,
        "is_torch_stream": True,
        "repr": "<torch.tpu.TpuStream>",
        "record_event_is_tpu_event": True,
        "work_inside_ran": True,
        "by_id_is_tpu_stream": True,
    }
    assert out["stream_query"]["type"] == "NotImplementedError"
    events = read_events(tmp_path)[0]
    flushes = [(e.cause, e.site.line if e.site else None) for e in events if isinstance(e, Flush)]
    assert ("event_record", line_of("emulated_streams.py", "record")) in flushes
    assert ("stream_synchronize", line_of("emulated_streams.py", "stream_sync")) in flushes
    assert {"event_synchronize", "stream_synchronize"} <= {e.op for e in events if isinstance(e, HostSync)}


def test_torch_profiler_sees_the_dispatched_ops_not_the_emulators_own() -> None:
    """One record per op the program ran: no second aten::mm for the CPU kernel beneath it and no
    aten::_to_copy for the bf16 rounding of its inputs, in Strict and in DeferAndFuse (whose graph runs at
    the flush); recording works as usual around it."""
    out = run_script("emulated_profiler.py")
    once = {
        "aten::mm": 1,
        "aten::relu": 1,
        "aten::_to_copy": 0,
        "aten::add": 1,
        "aten::sum": 1,
        "aten::_local_scalar_dense": 1,
    }
    assert out["strict"] == once
    assert out["fused"] == once
    assert out["after"] == once
    assert out["cpu_add"] == 1


def test_a_tpu_model_sent_to_a_worker_process_is_refused_with_what_to_do() -> None:
    out = run_script("emulated_hogwild.py")
    assert isinstance(out, dict)
    assert out["tpu"].startswith("a tpu tensor (shape (2, 2)) cannot be sent to another process")
    assert "keep the shared model on the CPU" in out["tpu"] and "tpu-agent run --nproc N" in out["tpu"]
    assert out["saved"] is True  # torch.save does not go through multiprocessing's pickler
    assert out["cpu_update"] == 4.0  # Hogwild on the CPU still shares the worker's update
