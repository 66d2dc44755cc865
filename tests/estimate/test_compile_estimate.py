"""Deviceless AOT compilation through libtpu: the compiler's figures checked against arithmetic."""

from __future__ import annotations

import pytest
from jax_gpt import GptShape, train_step_program, wide_mlp_step_program
from tpu_compiler import needs_tpu_compiler

from tpu_agent.chips import parse_target
from tpu_agent.errors import TpuAgentError
from tpu_agent.estimate.compiler import topology_name
from tpu_agent.estimate.model import StepProgram
from tpu_agent.estimate.step import compile_order, estimate_step, placement, suggest_fixes

pytestmark = [needs_tpu_compiler, pytest.mark.slow]


@pytest.mark.parametrize("spec", ["v5e", "v6e-4"])
def test_small_gpt_step_flops_and_memory_match_arithmetic(spec: str) -> None:
    shape = GptShape()
    target = parse_target(spec)
    estimate = estimate_step([train_step_program(shape)], target, "data-parallel", shape.training_flops())
    (program,) = estimate.programs
    # FLOPs: the compiler's count over the slice within 10% of 6*N*tokens plus causal attention's terms.
    assert program.flops * target.chips == pytest.approx(shape.training_flops(), rel=0.10)
    # Inputs: parameters, Adam's two moments (f32) and this chip's share of the batch, as the compiler counts them.
    analytic_inputs = 3 * shape.parameters * 4 + (shape.tokens // target.chips) * 4
    assert program.compiler_argument_bytes == pytest.approx(analytic_inputs, rel=0.01)
    assert program.memory.parameters == shape.parameters * 4
    assert program.memory.optimizer_state == 2 * shape.parameters * 4
    assert estimate.fits and estimate.step_seconds > 0 and 0 < estimate.mfu <= 1
    collectives = program.hlo.collectives_by_kind()
    assert ("all-reduce" in collectives) == (target.chips > 1)  # data parallelism all-reduces gradients
    assert program.hlo.fusions > 0


def test_model_too_big_for_one_v5e_fits_sharded_over_four_and_the_fix_is_compiled() -> None:
    d_model, hidden = 16384, 65536  # 2.1B parameters: 17 GB of f32 weights and momentum alone
    program = wide_mlp_step_program(d_model, hidden, batch=64)
    parameters = 2 * d_model * hidden
    one_chip = estimate_step([program], parse_target("v5e"))
    assert not one_chip.fits and one_chip.programs[0].refused  # the compiler itself refuses: out of HBM
    assert one_chip.peak_hbm_bytes >= 2 * parameters * 4
    suggestions = suggest_fixes([program], parse_target("v5e"), "as-captured", max_compiles=2)
    assert [s.change for s in suggestions] == [
        "keep parameters and optimizer state in bf16",
        "FSDP over a v5e-4 slice (the same global batch: 4x smaller per chip)",
    ]
    bf16, sharded = suggestions
    assert bf16.fits and bf16.target == "v5e"  # bf16 weights, momentum and gradients: 12.9 GB
    assert sharded.fits and sharded.target == "v5e-4" and sharded.peak_hbm_bytes < 15 * 1024**3
    fsdp = estimate_step([program], parse_target("v5e-4"), "fsdp")  # the same compile, served from the cache
    assert fsdp.programs[0].memory.parameters == parameters * 4 // 4
    assert "all-gather" in fsdp.programs[0].hlo.collectives_by_kind()  # FSDP gathers parameters before use


def test_unsupported_targets_are_refused_with_the_choices() -> None:
    with pytest.raises(TpuAgentError, match="slice of 3 chips") as error:
        topology_name(parse_target("v5e-3"))
    assert "use a slice of 1, 4, 8" in error.value.hint
    with pytest.raises(TpuAgentError, match="not supported"):
        topology_name(parse_target("v7"))


def test_placement_splits_only_what_divides() -> None:
    from tpu_agent.estimate.model import ArgRole, ArgSpec

    weight = ArgSpec("w", (6, 8), "float32", ArgRole.PARAMETER)
    assert placement(weight, "fsdp", 4) == 1 and placement(weight, "fsdp", 2) == 0
    assert placement(weight, "data-parallel", 4) is None
    assert placement(ArgSpec("x", (5, 8), "int32", ArgRole.BATCH), "fsdp", 4) is None


def test_a_step_too_big_in_its_activations_names_them_and_says_what_was_not_compiled() -> None:
    from tpu_agent.estimate.report import summary_rows, to_markdown

    # 0.5 GB of parameters, a (65536, 65536) f32 activation of 16 GiB: the step's temporaries do not fit a v5e
    program = wide_mlp_step_program(1024, 65536, batch=65536)
    target = parse_target("v5e")
    estimate = estimate_step([program], target)
    assert not estimate.fits
    assert estimate.largest_memory[0][0] == "temporaries"
    assert dict(summary_rows(estimate))["largest HBM uses"].startswith("temporaries")
    estimate.suggestions = suggest_fixes([program], target, "as-captured", max_compiles=2)
    compiled = [s for s in estimate.suggestions if s.verified]
    assert [s.target for s in compiled] == ["v5e", "v5e-4"]  # bf16 state; the batch split over four chips
    assert compiled[1].fits and "4x smaller per chip" in compiled[1].change
    unverified = [s.change for s in estimate.suggestions if not s.verified]
    assert len(unverified) == 2 and unverified[0].startswith("activation checkpointing")
    assert "| unverified |" in to_markdown(estimate)


@needs_tpu_compiler
def test_state_that_other_programs_read_stays_in_each_programs_hbm() -> None:
    """A step cut into programs (FSDP2's layer at a time, an optimizer update per tensor group): each program reads
    a share of the parameters and optimizer state, while all of it stays on the chip. Two 4 GiB weights and their
    4 GiB moments on one v5e (16 GB): every program reads at most 8 GiB and compiles, yet every program's HBM holds
    all 16 GiB, counted once, and the step does not fit."""
    import jax.numpy as jnp

    from tpu_agent.estimate.model import ArgRole, ArgSpec, StepProgram

    side = 32768  # 4 GiB per f32 tensor
    weights = [ArgSpec(f"w{i}", (side, side), "float32", ArgRole.PARAMETER, storage=i) for i in range(2)]
    moments = [ArgSpec(f"m{i}", (side, side), "float32", ArgRole.OPTIMIZER_STATE, storage=10 + i) for i in range(2)]
    batch = ArgSpec("x", (8, side), "float32", ArgRole.BATCH, 0, storage=20)
    programs = [StepProgram("0: layer", lambda w, x: jnp.tanh(x @ w), (weights[0], batch))] + [
        StepProgram(f"{1 + i}: update", lambda w, m: (w - m, m * 0.9), (weights[i], moments[i]), donated=(0, 1))
        for i in range(2)
    ]
    estimate = estimate_step(programs, parse_target("v5e"))
    tensor = side * side * 4
    for program in estimate.programs:
        assert not program.refused and program.compiler_argument_bytes <= 2 * tensor + 8 * side * 4, program.name
        assert program.memory.parameters == 2 * tensor and program.memory.optimizer_state == 2 * tensor, program.name
    assert not estimate.fits and estimate.peak_hbm_bytes >= 4 * tensor
    assert any("count in every program" in line for line in estimate.assumptions)


def test_the_largest_program_lowers_while_the_second_largest_compiles() -> None:
    """Lowering is one program at a time: the largest (the optimizer update) goes second, the rest largest first."""
    sizes = {"layer": 900, "update": 5000, "loss": 300, "embed": 40, "unknown": 0, "attention": 1200}
    programs = [StepProgram(name, lambda: None, (), ops=ops) for name, ops in sizes.items()]
    order = [program.name for program in compile_order(programs)]
    assert order == ["attention", "update", "layer", "loss", "embed", "unknown"]
