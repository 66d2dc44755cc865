"""Per-step overhead of the emulated ``tpu`` device on small Hugging Face models, side by side with plain CPU.

Small and medium models are dispatch-bound: their steps are hundreds of tiny ops, so the emulator's cost per op
decides the ratio (the GPT benchmark in ``runtime_bench.py`` hides it behind large matmuls). Each model is
built with ``transformers`` from a tiny config (hidden 64, 2 layers; nothing is downloaded) and trained for a
few steps: forward with labels, backward, AdamW step, ``loss.item()``. Each model gets fresh processes with one
intra-op thread, in which a copy per configuration (plain CPU, Strict, DeferAndFuse) trains a step in turn, so
that load from other processes hits all of them alike. Steps are timed by the stepping thread's CPU time (all
the work runs on it), which load from other processes barely moves; wall-clock times are printed next to it.

Targets (issue 10): Strict <= 2x CPU and DeferAndFuse no slower than Strict, on the median over the models.
What any Python tensor subclass pays per op on these models, before emulating anything, is measured beside
Strict by ``dispatch_floor.py`` (the floor these ratios cannot go below in this design).

    python benchmarks/hf_step_bench.py [--models llama,bert,gpt2,t5] [--steps 10] [--warmup 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {"cpu": None, "strict": "strict", "defer-and-fuse": "defer_and_fuse"}
MODELS = ("llama", "bert", "gpt2", "t5")
SEQ, BATCH, VOCAB = 16, 2, 256
TARGETS = {"strict": ("cpu", 2.0), "defer-and-fuse": ("strict", 1.0)}


def build(name: str):  # noqa: ANN201 - transformers is imported lazily, in the child
    import transformers as tf

    small = {"vocab_size": VOCAB}
    if name == "llama":
        config = tf.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **small,
        )
        return tf.LlamaForCausalLM(config)
    if name == "bert":
        config = tf.BertConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            **small,
        )
        return tf.BertForMaskedLM(config)
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, **small))
    if name == "t5":
        config = tf.T5Config(
            d_model=64,
            d_ff=128,
            d_kv=16,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            **small,
        )
        return tf.T5ForConditionalGeneration(config)
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def child(name: str, steps: int, warmup: int) -> None:
    """Train one copy of the model per configuration in this process, a step of each in turn; print one JSON line
    with each configuration's best and median step (thread CPU time) and best wall-clock step.

    Interleaving step by step puts load from other processes on every configuration alike, within milliseconds;
    a CPU model is untouched by the emulator (its ops never reach the tpu dispatcher), and the eager mode is
    switched between steps as a program may (leaving DeferAndFuse runs its pending graph first)."""
    import copy

    import torch

    from tpu_agent.runtime.emulated import activate

    torch.set_num_threads(1)
    activate(eager_mode="strict")
    torch.manual_seed(0)
    base = build(name)
    runs = {}
    for config, eager_mode in CONFIGS.items():
        device = "cpu" if eager_mode is None else "tpu"
        model = copy.deepcopy(base).to(device)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ)).to(device)
        runs[config] = (eager_mode, model, ids, torch.optim.AdamW(model.parameters(), lr=1e-3))
    cpu_times: dict[str, list[float]] = {config: [] for config in CONFIGS}
    wall_times: dict[str, list[float]] = {config: [] for config in CONFIGS}
    for step in range(warmup + steps):
        for config, (eager_mode, model, ids, optimizer) in runs.items():
            torch.tpu.eager_mode = eager_mode or "strict"
            start_cpu, start_wall = time.thread_time(), time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()
            if step >= warmup:
                cpu_times[config].append(time.thread_time() - start_cpu)
                wall_times[config].append(time.perf_counter() - start_wall)
    result = {
        config: {
            "min_s": min(cpu_times[config]),
            "median_s": statistics.median(cpu_times[config]),
            "wall_min_s": min(wall_times[config]),
        }
        for config in CONFIGS
    }
    print(json.dumps(result))


def run_child(name: str, steps: int, warmup: int) -> dict[str, dict[str, float]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_AGENT_"))}
    command = [sys.executable, __file__, "--child", name, "--steps", str(steps), "--warmup", str(warmup)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per model (best step over all)")
    parser.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.warmup)
        return
    print(
        f"one intra-op thread; {args.rounds} processes per model, each interleaving {args.steps} steps of every "
        f"configuration after {args.warmup} warm-up; "
        "best step's thread CPU time in ms (wall-clock in parentheses)"
    )
    print(
        f"{'model':<7}"
        + "".join(f"{c + ' ms':>18}" for c in CONFIGS)
        + f"{'strict/cpu':>12}{'fused/strict':>14}{'fused/cpu':>11}"
    )
    ratios: dict[str, list[float]] = {"strict/cpu": [], "fused/strict": [], "fused/cpu": []}
    for name in args.models.split(","):
        runs = [run_child(name, args.steps, args.warmup) for _ in range(args.rounds)]
        best = {config: min(run[config]["min_s"] for run in runs) for config in CONFIGS}
        wall = {config: min(run[config]["wall_min_s"] for run in runs) for config in CONFIGS}
        row = {
            "strict/cpu": best["strict"] / best["cpu"],
            "fused/strict": best["defer-and-fuse"] / best["strict"],
            "fused/cpu": best["defer-and-fuse"] / best["cpu"],
        }
        for key, value in row.items():
            ratios[key].append(value)
        cells = "".join(f"{f'{best[config] * 1e3:.1f} ({wall[config] * 1e3:.0f})':>18}" for config in CONFIGS)
        print(
            f"{name:<7}{cells}{row['strict/cpu']:>11.2f}x{row['fused/strict']:>13.2f}x{row['fused/cpu']:>10.2f}x",
            flush=True,
        )
    medians = {key: statistics.median(values) for key, values in ratios.items()}
    print(
        f"median over models: strict/cpu {medians['strict/cpu']:.2f}x (target <= 2.0x: {'met' if medians['strict/cpu'] <= 2.0 else 'MISSED'}), "
        f"fused/strict {medians['fused/strict']:.2f}x (target <= 1.0x: {'met' if medians['fused/strict'] <= 1.0 else 'MISSED'}), "
        f"fused/cpu {medians['fused/cpu']:.2f}x"
    )


if __name__ == "__main__":
    main()
