"""The optimized-HLO reader, on HLO text of the shape libtpu prints (no compiler needed)."""

from __future__ import annotations

import pytest

from tpu_agent.estimate.hlo import ArrayShape, parse_arrays, summarize

HLO = """HloModule jit_step, entry_computation_layout={(f32[1000,1000]{1,0})->f32[1000,1000]{1,0}}

%fused_computation (param_0.5: f32[1024,1000], param_1.6: bf16[1000,1000]) -> f32[1024,1000] {
  %param_0.5 = f32[1024,1000]{0,1:T(8,128)} parameter(0)
  %param_1.6 = bf16[1000,1000]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %convolution.3 = f32[1024,1000]{0,1:T(8,128)} convolution(%param_0.5, %param_1.6), dim_labels=bf_io->bf, metadata={op_name="jit(f)/dot_general"}
}

ENTRY %main.12 (Arg_0.1: f32[1000,1000], Arg_1.2: f32[1024,1000]) -> f32[1000,1000] {
  %Arg_0.1 = f32[1000,1000]{1,0:T(8,128)} parameter(0)
  %Arg_1.2 = f32[1024,1000]{1,0:T(8,128)} parameter(1)
  %shard.1 = bf16[1,250,1000]{1,2,0:T(8,128)(2,1)} parameter(2)
  %all-gather.7 = bf16[4,250,1000]{1,2,0:T(8,128)(2,1)} all-gather(%shard.1), channel_id=2, dimensions={0}
  %fusion = f32[1024,1000]{0,1:T(8,128)} fusion(%Arg_1.2, %all-gather.7), kind=kOutput, calls=%fused_computation
  %dot.1 = f32[1000,1000]{1,0} dot(%fusion, %Arg_1.2), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %tuple.1 = (f32[1000,1000]{1,0}, f32[]) tuple(%dot.1, %dot.1)
  ROOT %all-reduce = f32[1000,1000]{1,0:T(8,128)} all-reduce(%dot.1), channel_id=3, to_apply=%add.clone
}
"""


def test_summary_counts_fusions_collectives_and_matmul_flops() -> None:
    summary = summarize(HLO)
    assert summary.fusions == 1
    kinds = summary.collectives_by_kind()
    assert kinds["all-gather"] == {"count": 1, "bytes": 4 * 250 * 1000 * 2}
    assert kinds["all-reduce"] == {"count": 1, "bytes": 1000 * 1000 * 4}
    flops = {op.name: op.flops for op in summary.matmuls}
    assert flops["convolution.3"] == 2 * 1024 * 1000 * 1000  # bf_io->bf: contracted over the lhs feature dim
    assert flops["dot.1"] == 2 * 1000 * 1000 * 1024  # lhs_contracting_dims={0} of a [1024, 1000] operand
    assert summary.top_matmuls(1)[0].op_name in ("jit(f)/dot_general", "")


def test_tiled_layouts_pad_the_most_minor_dims() -> None:
    (array,) = parse_arrays("f32[1000,1000]{1,0:T(8,128)}")
    assert array == ArrayShape("f32", (1000, 1000), (1, 0), (8, 128))
    assert array.padded_bytes == 1000 * 1024 * 4  # dim 1 (most minor) to 1024; dim 0 is a multiple of 8
    (column_major,) = parse_arrays("f32[1024,1000]{0,1:T(8,128)}")
    assert column_major.padded_bytes == 1024 * 1000 * 4  # dim 0 is most minor and already a multiple of 128
    assert 0 < summarize(HLO).layout_padding_fraction < 0.05


@pytest.mark.parametrize("text", ["", "HloModule empty", "garbage ( ) = %%", "%x = f32[ broken"])
def test_malformed_text_gives_an_empty_summary_not_an_error(text: str) -> None:
    summary = summarize(text)
    assert summary.fusions == 0 and summary.collectives == [] and summary.matmuls == []
