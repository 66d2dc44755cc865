"""Training scripts written the way public ones are, estimated with no flag: the toy GPT of issue 34 (device from
torch.accelerator, nn.Embedding, RMSNorm, SDPA with is_causal, SwiGLU, AdamW, tokens from torch.randint on the
device, loss.item() printed), a script that branches on its batch's values under --capture-only, and what a script
that died of SIGKILL (as the kernel's OOM killer ends one) is reported as."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_estimate_cli import SCRIPTS, run_cli
from tpu_compiler import needs_tpu_compiler

GPT = SCRIPTS / "gpt_train.py"


@needs_tpu_compiler
@pytest.mark.slow  # one CLI subprocess: the toy GPT's steps and one TPU compile
def test_the_toy_gpt_gets_a_verdict_from_whole_steps_once_the_host_bound_switches_to_capture_only() -> None:
    """Three failures of issue 34 in one run: torch.randint on the device (aten.random.from made FX write a
    SyntaxError), no step cut without a process group under capture-only (the three steps were one graph), and a
    run that grows past the host: a 0.5 MB bound switches the run to capture-only while the model is built."""
    vocab, d_model, layers, batch, seq = 512, 128, 2, 8, 64
    result = run_cli(
        "estimate", "--chip", "v5e", "--format", "json", "--no-suggest", "--host-memory", "0.0005",
        "--steps", "2", str(GPT), "--vocab", str(vocab), "--batch", str(batch), "--steps", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runs op by op" not in result.stderr  # no graph fell back to the CPU
    document = json.loads(result.stdout)
    estimate = document["estimate"]
    assert estimate["verdict"] == "fits" and estimate["step_ops_share"] == 1.0
    assert "parameters reached" in document["capture_only_chosen"]
    assert any(line.startswith("capture-only chosen by estimate") for line in estimate["assumptions"])
    # one step's work, not three: 6 FLOPs per parameter and token, plus causal attention
    hidden = int(8 * d_model / 3)
    parameters = layers * (4 * d_model * d_model + 3 * d_model * hidden) + vocab * d_model
    tokens = batch * seq
    expected = 6 * parameters * tokens + layers * 6 * batch * seq * seq * d_model
    assert 0.8 * expected < estimate["flops_per_chip_per_step"] < 2 * expected, estimate["flops_per_chip_per_step"]


VALUES = """
import torch

device = torch.device("tpu")
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).to(device)
with device:
    head = torch.nn.Linear(16, 4)
torch.nn.init.trunc_normal_(head.weight, std=0.02)  # loops on mask.any() in torch 2.13
optimizer = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-3)
mask = torch.ones(4, 16, dtype=torch.long)
mask[1, -2:] = 0
for step in range(3):
    x = torch.randn(4, 16)
    keep = mask.to(device).bool()
    if keep.all():  # a library's branch on the batch's mask (transformers' sdpa_mask): decided on real data
        raise SystemExit("the mask has padding: all() must be False")
    picked = torch.masked_select(x.to(device), keep)  # a value-dependent size, of real data: computed
    loss = model(picked[:16].view(1, 16)).square().mean() + head(model(x.to(device))).nonzero().float().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@needs_tpu_compiler
@pytest.mark.slow  # one CLI subprocess with a small compile
def test_capture_only_reads_small_real_data_bounds_value_sized_ops_and_skips_value_loops(tmp_path: Path) -> None:
    """Values under --capture-only: a branch on the uploaded mask is answered from real data (HF models branch on
    mask.all() before attention), masked_select of real data runs, nonzero of a data-less tensor is bounded, and
    trunc_normal_ (which loops on mask.any()) is skipped; each is said in the assumptions."""
    script = tmp_path / "train.py"
    script.write_text(VALUES)
    result = run_cli("estimate", "--capture-only", "--chip", "v5e", "--format", "json", "--no-suggest", str(script))
    assert result.returncode == 0, result.stderr[-3000:]
    assumptions = json.loads(result.stdout)["estimate"]["assumptions"]
    said = "\n".join(assumptions)
    assert f"a branch on a tensor (bool(tensor)) at {script}:15: answered with its real value" in said
    assert f"torch.nn.init.trunc_normal_ at {script}:8: skipped" in said
    assert f"aten.nonzero.default at {script}:18: its output size depends on values; bounded by its largest" in said
    assert f"(aten.masked_select.default) at {script}:17: answered with its real value" in said  # its inputs had data


def test_a_killed_script_is_reported_as_killed_naming_memory_and_capture_only() -> None:
    """A 0.7B GPT run for real was killed at 21 GB and reported as 'exited with code 137 ... run it with
    tpu-agent run first'. (The launcher reports death by SIGKILL as 137, as a shell does.)"""
    from tpu_agent.estimate.script import run_failure

    error = run_failure("train.py", 137)
    assert error.code == "script-killed" and int(error.exit_code) == 1
    assert "killed (SIGKILL, exit code 137)" in error.message and "out of memory" in error.message
    assert "--capture-only" in error.hint
    assert run_failure("train.py", 3).code == "script-failed"
