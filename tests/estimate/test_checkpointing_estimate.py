"""Activation checkpointing in ``tpu-agent estimate``: a step whose blocks run under ``torch.utils.checkpoint``
is compiled recomputing them, so its activations are smaller and its FLOPs larger than the same step's without.

The step is one program (``preserve_rng_state=False``: no RNG state read cuts it), where XLA would otherwise merge
the recomputed forward with the forward itself and keep every activation, as without checkpointing."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from test_estimate_cli import SCRIPTS, run_cli
from tpu_compiler import needs_tpu_compiler

from tpu_agent.estimate import recompute
from tpu_agent.runtime.xla import barrier

GPT = SCRIPTS / "gpt_train.py"
SHAPE = ("--vocab", "256", "--d-model", "128", "--layers", "4", "--heads", "2", "--batch", "8", "--seq", "256")


def _estimate(checkpointing: str) -> dict[str, Any]:
    result = run_cli(
        "estimate", "--capture-only", "--chip", "v5e", "--format", "json", "--no-suggest", "--steps", "2",
        str(GPT), *SHAPE, "--steps", "2", "--checkpointing", checkpointing, "--no-preserve-rng",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    estimate: dict[str, Any] = json.loads(result.stdout)["estimate"]
    assert len(estimate["programs"]) == 1, [program["name"] for program in estimate["programs"]]
    return estimate


def _temporaries(estimate: dict[str, Any]) -> int:
    """What the compiled step holds while it runs besides its inputs and results: its activations."""
    return int(estimate["programs"][0]["memory"]["temporaries"])


@needs_tpu_compiler
@pytest.mark.slow  # two CLI subprocesses, each a small capture-only estimate and one TPU compile
def test_checkpointed_blocks_are_recomputed_in_flops_and_not_kept_in_memory() -> None:
    """Non-reentrant checkpointing (FSDP2's and TorchTitan's): 4 blocks' activations against one block's at a
    time. Without the barrier XLA merged most of the recomputation with the forward: 0.67x the temporaries of the
    step without checkpointing (0.24x with it), and 1.19x its FLOPs (1.24x)."""
    plain, checkpointed = _estimate("none"), _estimate("non-reentrant")
    assert _temporaries(checkpointed) < 0.5 * _temporaries(plain), (plain["programs"], checkpointed["programs"])
    # about one more forward of the blocks: a third more than forward + backward, less the unrecomputed head
    ratio = checkpointed["flops_per_chip_per_step"] / plain["flops_per_chip_per_step"]
    assert 1.15 < ratio < 1.45, ratio
    said = "\n".join(checkpointed["assumptions"])
    assert "activation checkpointing: 4 recomputation(s) per step" in said
    assert "activation checkpointing" not in "\n".join(plain["assumptions"])


@needs_tpu_compiler
def test_the_tpu_compiler_keeps_a_matmul_behind_the_barrier_apart_from_the_same_matmul_before_it() -> None:
    """What the lowering relies on: x @ w and barrier(x) @ w stay two matmuls in the TPU program (twice the FLOPs),
    where x @ w twice is merged into one, as a recomputed forward was merged with the forward. (XLA's CPU pipeline
    removes the barrier before it merges: only the TPU compile is evidence.)"""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from tpu_agent.chips import parse_target
    from tpu_agent.estimate.compiler import compile_for_target, tpu_devices

    target = parse_target("v5e")
    on_the_chip = NamedSharding(Mesh(np.array(tpu_devices(target)), ("chips",)), PartitionSpec())
    args = [jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=on_the_chip)] * 2

    def flops(function: Any) -> float:
        return compile_for_target(function, args, target).cost["flops"]

    merged = flops(lambda x, w: jnp.tanh(x @ w) + x @ w)
    kept = flops(lambda x, w: jnp.tanh(x @ w) + barrier.lowered([x])[0] @ w)
    assert kept > 1.8 * merged, (merged, kept)


def test_the_recomputation_inputs_keep_values_and_leave_host_tensors_alone() -> None:
    """The op copies (a custom op's outputs may not alias its inputs), and :func:`recompute.behind_barrier` puts
    only device tensors behind it: a CPU tensor (a checkpointed CPU module) and a non-tensor pass through."""
    cpu = torch.arange(3.0)
    copies = barrier.optimization_barrier([cpu, cpu * 2])
    assert torch.equal(copies[0], cpu) and torch.equal(copies[1], cpu * 2)
    assert copies[0].data_ptr() != cpu.data_ptr()
    passed = recompute.behind_barrier((cpu, 5))
    assert passed[0] is cpu and passed[1] == 5
