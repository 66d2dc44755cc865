"""A 7B-parameter Llama estimated for a v6e-8 slice with FSDP2 on a machine that could not hold it.

``tpu-agent estimate --capture-only`` runs ``tests/estimate/scripts/llama_fsdp_train.py --preset 7b``
(transformers' LlamaForCausalLM with Llama-2-7B's shapes, bf16, SDPA attention, HF activation checkpointing,
every decoder layer ``fully_shard``-ed, AdamW) at 6 x 8192 tokens per chip, and compiles its step for v6e-8 with
the TPU compiler (libtpu). The target (issue 34): at most 2 minutes and 8 GB of host memory, and "fits", as
such a step does on v6e-8 hardware. Printed side by side: the parameters' bytes and
the peak resident memory of the whole run (the estimate's process and the script's), which capture-only mode
keeps far below them, and the estimate itself (verdict, HBM per chip, step time). Needs libtpu
(``pip install "tpu-agent[estimate]"``). Takes minutes on two cores.

    python benchmarks/estimate_7b_bench.py [--chip v6e-8] [--batch 48] [--seq 8192] [--no-checkpointing]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "estimate" / "scripts" / "llama_fsdp_train.py"
# Llama-2-7B: 32 layers of hidden 4096 / MLP 11008, vocabulary 32000, untied embeddings
HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 4096, 11008, 32, 32000


def parameters() -> int:
    layer = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN
    return LAYERS * layer + 2 * VOCAB * HIDDEN + HIDDEN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chip", default="v6e-8")
    parser.add_argument("--batch", type=int, default=48, help="the global batch: 6 sequences per chip of v6e-8")
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args()
    command = [
        sys.executable, "-m", "tpu_agent", "estimate", "--chip", args.chip, "--strategy", "fsdp", "--capture-only",
        "--no-suggest", "--format", "json", str(SCRIPT),
        "--preset", "7b", "--dtype", "bfloat16", "--batch", str(args.batch), "--seq", str(args.seq),
        *([] if args.no_checkpointing else ["--checkpointing"]),
        "--loss-chunks", "8",  # the f32 logits and loss a sequence chunk at a time, as the calibration runs do
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    seconds = time.perf_counter() - start
    peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest process of the run
    if not result.stdout:
        sys.exit(f"estimate failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    document = json.loads(result.stdout)
    if "estimate" not in document:
        sys.exit(f"estimate failed: {document.get('error')}")
    estimate = document["estimate"]
    parameter_bytes = parameters() * 2  # bf16
    checkpointing = "no checkpointing" if args.no_checkpointing else "activation checkpointing"
    print(
        f"7B Llama ({parameters() / 1e9:.2f}B parameters, bf16) on {estimate['target']}, FSDP, {checkpointing}, "
        f"{args.batch} x {args.seq} tokens, capture-only"
    )
    print(f"  parameter bytes          {parameter_bytes / 2**30:8.2f} GiB")
    print(f"  peak host RSS (any proc) {peak_rss / 2**30:8.2f} GiB  ({peak_rss / parameter_bytes:.3f}x the parameters)")
    print(f"  verdict                  {estimate['verdict']}")
    print(f"  HBM per chip             {estimate['peak_hbm_bytes_per_chip'] / 2**30:8.2f} GiB")
    print(f"  step time (compiler)     {estimate['step_seconds'] * 1e3:8.1f} ms,  MFU {estimate['mfu'] or 0:.2f}")
    calibrated = estimate.get("calibrated")
    if calibrated:
        print(
            f"  step time (calibrated)   {calibrated['seconds'] * 1e3:8.1f} ms "
            f"({calibrated['low_seconds'] * 1e3:.0f} to {calibrated['high_seconds'] * 1e3:.0f}),  "
            f"MFU {calibrated['mfu'] or 0:.2f}"
        )
    print(f"  wall time of the estimate {seconds:7.0f} s (measured under the machine's current load)")


if __name__ == "__main__":
    main()
