"""`tpu-agent estimate --capture-only`: a script's step recorded from shapes, never computed, for models bigger than
the machine. A real-shaped script (transformers' LlamaForCausalLM, FSDP2 fully_shard, AdamW) is estimated end to end
through the CLI; the mode's refusals name the user's line.

The 7B configuration on v5e-8 takes minutes on two cores: it is ``benchmarks/estimate_7b_bench.py``."""

from __future__ import annotations

import json
import resource
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_estimate_cli import SCRIPTS, run_cli
from tpu_compiler import needs_tpu_compiler

LLAMA = SCRIPTS / "llama_fsdp_train.py"
# one Llama-70B-wide decoder layer with its embeddings (1.5B parameters): f32 weights, gradients and AdamW's two
# moments need 24 GB, more than one v5e's 16 GB, a quarter of that on each chip of a v5e-4. One layer keeps the TPU
# compiles short.
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB = 8192, 28672, 1, 64, 8, 32000


def llama_parameters() -> int:
    head = HIDDEN // HEADS
    attention = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * head
    layer = attention + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN  # + two RMSNorm weights
    return LAYERS * layer + 2 * VOCAB * HIDDEN + HIDDEN  # embedding, untied LM head, final norm


def _estimate(*options: str) -> tuple[dict[str, Any], str]:
    sizes = {
        "--hidden": HIDDEN, "--intermediate": INTERMEDIATE, "--layers": LAYERS, "--heads": HEADS,
        "--kv-heads": KV_HEADS, "--vocab": VOCAB, "--batch": 2, "--seq": 64, "--steps": 2,
    }  # fmt: skip
    script_args = [text for name, value in sizes.items() for text in (name, str(value))]
    result = run_cli(
        "estimate", "--capture-only", "--format", "json", "--steps", "2", *options, str(LLAMA),
        *script_args, "--attention", "eager", "--no-fsdp", timeout=1800,
    )  # fmt: skip
    assert result.stdout, result.stderr[-3000:]
    return json.loads(result.stdout), result.stderr


@needs_tpu_compiler
@pytest.mark.slow  # a 1.5B-parameter Llama: the script runs on meta data, the TPU compiler compiles its step
@pytest.mark.long  # about 90 s: a cold TPU compile of the sharded step
def test_model_too_big_for_one_v5e_fits_with_fsdp_over_four() -> None:
    """A model whose f32 state needs 24 GB, more than one v5e's 16 GB, a quarter of it on each chip of a v5e-4.
    (A step that does not fit one chip is the compiler's refusal, tested on a 2.1B-parameter step in
    test_compile_estimate.py; one more capture of this size here would be half a minute of CPU.)"""
    four_chips, stderr = _estimate("--chip", "v5e-4", "--strategy", "fsdp")
    estimate = four_chips["estimate"]
    assert four_chips["capture_only"] is True
    assert estimate["verdict"] == "fits" and estimate["chips"] == 4, stderr[-3000:]
    # loss.item() saw a placeholder, once warned for its line
    assert stderr.count("capture-only: Tensor.item() at ") == 1 and "llama_fsdp_train.py:" in stderr
    parameters = llama_parameters()
    peak = max(estimate["programs"], key=lambda program: program["memory"]["total"])
    # parameters and AdamW's two moments, a quarter on each chip
    memory = [(program["name"], program["memory"]) for program in estimate["programs"]]
    assert peak["memory"]["parameters"] == pytest.approx(parameters * 4 / 4, rel=0.01), memory
    moments = max(program["memory"]["optimizer_state"] for program in estimate["programs"])
    assert moments == pytest.approx(2 * parameters * 4 / 4, rel=0.01), memory
    assert any("capture-only" in line for line in estimate["assumptions"])
    _assert_nothing_model_sized_was_on_the_host()


def _assert_nothing_model_sized_was_on_the_host() -> None:
    """Every child process this test worker has run stayed below half the model's 6 GB of f32 weights."""
    peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert peak_rss < llama_parameters() * 4 / 2


BRANCHING = """
import torch

model = torch.nn.Linear(8, 8, device="tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(4, 8, device="tpu")).square().mean()
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.3f}")
    if loss < 1.0:  # stops early on a value
        break
"""


@needs_tpu_compiler  # estimate refuses to start without the compiler
@pytest.mark.slow  # a CLI subprocess
def test_a_branch_on_a_tensor_value_is_reported_with_its_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(BRANCHING))
    result = run_cli("estimate", "--capture-only", "--chip", "v5e", "--format", "json", str(script))
    error = json.loads(result.stdout)["error"]
    assert result.returncode == 1, result.stderr[-2000:]
    assert error["code"] == "capture-only-needs-values"
    assert error["message"].startswith(f"{script}:11: a branch on a tensor (bool(tensor)) needs a tensor's value")
    assert "capture-only: Tensor.item() at" in result.stderr  # the print before it got a placeholder


@needs_tpu_compiler
@pytest.mark.slow  # a CLI subprocess that captures a tiny Llama and compiles its step's programs: about a minute
def test_fsdp_llama_with_a_chunked_checkpointed_loss_is_estimated_whole() -> None:
    """The calibration runs' configuration on tiny shapes: FSDP2 units for the decoder layers, the body and the
    head, with mixed precision (float32 weights, bf16 compute), the loss computed a chunk at a time under
    non-reentrant checkpointing by calling the body and the head directly (each must be a unit of its own, or the
    embedding meets a sharded weight in step 0)."""
    result = run_cli(
        "estimate", "--capture-only", "--chip", "v5e-4", "--strategy", "fsdp", "--no-suggest", "--format", "json",
        "--steps", "2", str(LLAMA), "--loss-chunks", "2", "--checkpointing", "--compute-dtype", "bfloat16",
        "--steps", "2", timeout=900,
    )  # fmt: skip
    assert result.stdout, result.stderr[-3000:]
    estimate = json.loads(result.stdout)["estimate"]
    assert estimate["verdict"] == "fits" and estimate["step_ops_share"] == 1.0
    assert not [program["name"] for program in estimate["programs"] if program["refused"]]
    assert any(line.startswith("activation checkpointing: ") for line in estimate["assumptions"])
    # the update reads each gradient as a view of FSDP2's flat buffer; on the slice each rank updates its own
    # shards, so nothing moves between chips (sharded as one flat array, the buffer needed collective-permutes)
    update = max(estimate["programs"], key=lambda program: program["memory"]["gradients"])
    assert update["memory"]["gradients"] > 0 and not update["hlo"]["collectives"], update["hlo"]
