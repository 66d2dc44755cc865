"""Regression tests for the emulated runtime's fault classes (issue: HF architectures and public scripts), one
fresh process per eager mode: fused attention parity, nested argument unwrapping, conjugate/negative views,
refused layouts, CPU kernels that refuse what the device accepts, DeferAndFuse shape-inference fallback,
``torch.Generator("tpu")``, growing ``resize_``, pinned memory (``pin_memory=True`` factories too), errors without
CPU kernel names, and autograd after a late ``activate()`` (the script runs a CPU backward before it).

One process observes every mode, switching in-process (as the check worker does), in the order of :data:`MODES`:
DeferAndFuse, the only mode that fills the shape cache, comes last, so the others are seen with it empty."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_launch_util import clean_env

from tpu_agent.runtime.emulated import cpu_gaps

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]
MODES = ("strict", "debug", "defer_and_fuse")


def _observe(_: Path) -> dict:
    env = clean_env()
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "emulated_faults.py"), *MODES],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def observed_by_mode(run_once: Callable[..., Any]) -> dict:
    return run_once("emulated-faults", _observe)


@pytest.fixture(params=MODES)
def observed(request: pytest.FixtureRequest, observed_by_mode: dict) -> dict:
    return observed_by_mode[request.param]


@pytest.mark.slow
def test_fused_attention_gives_cpu_numbers_for_every_input_sdpa_accepts(observed: dict) -> None:
    assert observed["attention"] == {
        "plain": True,
        "causal": True,
        "bool_mask": True,
        "mask_requires_grad": True,
        "gqa": True,
        "gqa_bool_mask": True,
    }


@pytest.mark.slow
def test_every_nested_argument_is_unwrapped(observed: dict) -> None:
    assert observed["index_with_list"] == {"device_index": True, "host_index": True, "nested": True}


@pytest.mark.slow
def test_conjugate_and_negative_views_and_zero_tensors_keep_their_meaning(observed: dict) -> None:
    assert observed["math_bits"] == {
        "conj_mul": True,
        "conj_flag": True,
        "neg_view": True,
        "complex_rotary_grads": True,
        "zero_tensor": True,
    }


@pytest.mark.slow
def test_sparse_and_quantized_data_is_refused_with_a_clear_error(observed: dict) -> None:
    sparse, quantized = observed["refused"]["sparse"], observed["refused"]["quantized"]
    assert (
        sparse["type"] == "RuntimeError"
        and "sparse tensors (torch.sparse_coo) are not supported on TPU" in sparse["message"]
    )
    assert (
        quantized["type"] == "NotImplementedError"
        and "quantized tensors are not supported on TPU" in quantized["message"]
    )


@pytest.mark.slow
def test_inputs_the_cpu_kernel_refuses_are_computed_another_way(observed: dict) -> None:
    assert observed["cpu_gaps"] == {
        "histc_int": True,
        "upsample_int": True,
        # torch calls CUDA-only fused cells on every accelerator: nn.LSTM / nn.GRU crashed on tpu in every mode
        "recurrent": {"lstm": True, "gru": True, "lstm_cell": True, "gru_cell": True},
    }


@pytest.mark.slow
def test_kernel_errors_name_the_op_not_the_cpu_kernel_and_hide_emulator_frames(observed: dict) -> None:
    error = observed["cpu_kernel_error"]
    assert "\"median\" not implemented for 'Bool'" in error["message"]
    assert "_cpu" not in error["message"]
    assert error["emulator_frames"] <= 2  # the entry point the program called (e.g. Tensor.item), nothing beneath


@pytest.mark.slow
def test_ops_whose_shapes_meta_cannot_infer_still_run(observed: dict) -> None:
    assert observed["grouped_mm_f32"] is True  # meta refuses f32 _grouped_mm; DeferAndFuse runs it eagerly


@pytest.mark.slow
def test_views_recorded_against_meta_strides_hold_when_the_cpu_kernel_picks_another_layout(observed: dict) -> None:
    assert observed["recorded_layout_view"] is True


@pytest.mark.slow
def test_tpu_generators_growing_resize_and_pinned_memory(observed: dict) -> None:
    assert observed["generator"] == {
        "device": "tpu:0",
        "state_bytes": 16,
        "matches_device_seed": True,
        "is_generator": True,
    }
    assert observed["resize_grow"] == {"shape": [2, 4], "kept": [0.0, 1.0, 2.0], "row": [5.0, 5.0, 5.0, 5.0]}
    assert observed["pinned"] == {
        "pin_memory": [False, True, True, True],
        "loader": [True, True, True],
        "factories": [True, True, True, True, True, False, True],
        "non_blocking": True,
    }
    assert observed["device_count"] == 1  # a single process on the default one-chip host


@pytest.mark.slow
def test_growing_a_tensor_in_place_resizes_it_or_is_refused_clearly(observed: dict) -> None:
    grow = observed["grow_in_place"]
    assert grow["set_larger"] == [[5], [0.0, 1.0, 2.0, 3.0, 4.0]]
    refused = grow["with_view_refused"]
    assert refused["type"] == "RuntimeError" and "views of it" in refused["message"] and "(8,)" in refused["message"]
    assert refused["emulator_frames"] <= 2  # the method the program called (Tensor.resize_), nothing beneath
    assert grow["after_refusal"] == [[3], [0.0, 0.0, 0.0], [0.0, 0.0]]  # the tensor is left as it was


@pytest.mark.slow
def test_out_arguments_take_the_results_shape(observed: dict) -> None:
    results = observed["out_arguments"]
    assert {k: results[k] for k in ("shrunk", "same_size", "tuple")} == {
        "shrunk": True,
        "same_size": True,
        "tuple": True,
    }
    refused = results["grow_refused"]
    assert refused["type"] == "RuntimeError" and "aten.cat.out" in refused["message"] and "(4, 3)" in refused["message"]
    assert refused["emulator_frames"] <= 2 and results["after_refusal"] == [0]


@pytest.mark.slow
def test_assigning_data_replaces_what_the_tensor_computes_with(observed: dict) -> None:
    assert observed["data_assign"] == {"values": True, "shape_follows": [[2, 3], True]}


@pytest.mark.slow
def test_repeated_training_steps_match_cpu_exactly(observed: dict, request: pytest.FixtureRequest) -> None:
    assert observed["repeated_steps"]["match_cpu"] is True
    # only DeferAndFuse records ops, so only it fills the shape cache
    mode = request.node.callspec.params["observed"]
    assert observed["repeated_steps"]["cached_signatures"] is (mode == "defer_and_fuse")


def test_cpu_gap_table_records_are_complete_and_exact() -> None:
    import torch

    for gap in cpu_gaps.GAPS:
        assert gap.ops and gap.refused_dtypes and gap.rationale and gap.cpu_error
        for op in gap.ops:
            assert cpu_gaps.BY_OP[op] is gap
    histc = cpu_gaps.BY_OP[torch.ops.aten.histc.default]
    values = torch.tensor([0, 5, 5, 9], dtype=torch.int64)
    with pytest.raises(RuntimeError, match="histogram_cpu"):
        torch.histc(values, bins=3, min=0, max=9)  # the CPU kernel still refuses: the table entry is needed
    counts = cpu_gaps.compute(histc, torch.ops.aten.histc.default, [values, 3, 0, 9], {})
    assert counts.dtype == torch.int64 and counts.tolist() == [1, 2, 1]
