"""What TorchTPU's guide pages document, checked on the emulated device: the rows of docs/torchtpu-fidelity.md
that no other test covers name these tests.

One real run of :data:`SCRIPT` under ``tpu-agent run`` (the ``torch_tpu`` face on the path, as a user's script
gets it) is shared by every test here; each test reads the part of its output that one guide statement is about.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from runtime_launch_util import SCRIPTS, tpu_agent

pytestmark = pytest.mark.slow  # one fresh torch process, compiling a few small functions
SCRIPT = SCRIPTS / "torchtpu_guide.py"


def _guide_run(directory: Path) -> dict[str, Any]:
    result = tpu_agent("run", "--backend", "emulated", str(SCRIPT), cwd=directory, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def guide(run_once: Any) -> dict[str, Any]:
    return dict(run_once("torchtpu-guide", _guide_run))


def test_bf16_factories_and_matmul_give_tpu_tensors_of_the_pages_size(guide: dict[str, Any]) -> None:
    assert guide["matmul"] == [[1024, 1024], "tpu:0", "torch.bfloat16", "cpu"]


def test_shape_and_dtype_errors_are_runtime_errors_raised_at_the_op(guide: dict[str, Any]) -> None:
    assert guide["negative_dim"] == "RuntimeError"
    assert guide["mismatch_at_op"] == "RuntimeError"  # raised by the `@` itself, also while ops are deferred
    assert guide["mm_dtypes"] == "RuntimeError"


def test_hbm_summary_names_the_executables_and_the_live_bytes(guide: dict[str, Any]) -> None:
    summary = guide["hbm_summary"]
    assert summary.startswith("CompilationCache HBM usage: 0B for ") and "Live tensors: " in summary


def test_the_profiler_refuses_gpu_activity_and_a_missing_handler(guide: dict[str, Any]) -> None:
    assert guide["gpu_activity"] == {"type": "ValueError", "message": "GPU profiling is not supported."}
    assert guide["no_handler"]["type"] == "ValueError" and "on_trace_ready" in guide["no_handler"]["message"]
    assert guide["tpu_profiler_module"] is False  # torch.tpu.profiler (torch >= 2.12's config) is not provided
    assert guide["nested_profile"] == {"type": "RuntimeError", "message": "Only one profile may be run at a time."}


def test_seeding_every_device_reproduces_the_draws(guide: dict[str, Any]) -> None:
    assert guide["seeded"] is True


def test_modules_of_the_wheel_the_face_lacks_are_not_importable(guide: dict[str, Any]) -> None:
    assert guide["not_provided"] == {
        "torch_tpu._internal.pallas": True,
        "torch_tpu._internal.distributed": True,
        "torch_tpu._internal.compile": True,
    }


def test_copied_weights_give_the_cpu_result_within_the_pages_tolerance(guide: dict[str, Any]) -> None:
    assert guide["parity"] is True


def test_an_eager_bf16_product_is_rounded_to_bf16_before_an_f32_multiply(guide: dict[str, Any]) -> None:
    # (1 + 2**-7)**2 is 1.01568603515625 in f32; its bf16 rounding is 1.015625
    assert guide["bf16_product"] == 1.015625


def test_a_small_vit_trains_with_adam_and_predicts_a_python_int(guide: dict[str, Any]) -> None:
    first, last = guide["vit_losses"]
    assert last < first
    assert guide["vit_prediction"] == "int"


def test_composed_modules_and_int32_bit_packing_run_on_the_device(guide: dict[str, Any]) -> None:
    assert guide["straight_through_grad"] is True
    assert guide["pack_roundtrip"] is True


def test_uint32_arange_is_refused_by_the_cpu_kernel(guide: dict[str, Any]) -> None:
    assert guide["uint32_arange"] == {
        "type": "NotImplementedError",
        "message": "\"arange_cpu\" not implemented for 'UInt32'",
    }


def test_a_custom_autograd_function_keeps_its_backward_eager_and_compiled(guide: dict[str, Any]) -> None:
    expected = [pytest.approx(0.01), 0.25, pytest.approx(0.01)]
    assert guide["custom_backward"] == expected
    assert guide["custom_backward_compiled"] == expected


def test_a_python_custom_op_runs_eager_and_in_a_compiled_graph(guide: dict[str, Any]) -> None:
    assert guide["custom_op"] == [[6.0, 6.0], [7.0, 7.0]]


def test_explain_counts_the_graph_break_at_a_host_read(guide: dict[str, Any]) -> None:
    assert guide["explain_graphs"] == 2


def test_a_compiled_step_with_a_non_capturable_adam_trains(guide: dict[str, Any]) -> None:
    losses = guide["uncapturable_losses"]
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]


def test_eager_mode_switches_and_the_profiler_are_forbidden_inside_compile(guide: dict[str, Any]) -> None:
    for name in ("set_eager_mode", "eager_mode_call", "profile"):
        assert guide[f"compiled_{name}"] == ["AssertionError", True], name
