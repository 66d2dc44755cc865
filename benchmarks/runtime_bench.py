"""Emulated ``tpu`` device vs plain CPU PyTorch: the same training steps, side by side, in one run.

Each configuration runs in a fresh subprocess (the emulation is per process, and the CPU baseline must not
pay for it): plain CPU, then the emulated device in Strict and in DeferAndFuse eager mode, for a small MLP
(dispatch-bound: many tiny ops, where per-op overhead shows) and a GPT-style model (d_model 512, 6 layers,
sequence 256: compute-bound, the target case). Every step is forward, cross-entropy, backward, AdamW step
and ``loss.item()`` (the usual logging sync). Every configuration uses the same number of intra-op threads
(``--threads``, default 1): on a small shared machine, OpenMP thread contention otherwise swamps the
comparison (the plain-CPU MLP step varied 2 ms to 430 ms with two threads). The emulation keeps TorchTPU's default matmul precision
(f32 inputs rounded to bf16), so its numbers include that cost.

The XLA configurations (``--compiler xla``) run the same steps through XLA:CPU: ``compile-xla`` wraps the
model in ``torch.compile(backend="tpu")`` (forward and backward graphs are XLA executables), and
``defer-and-fuse-xla`` compiles each DeferAndFuse step graph. For them the first step (which compiles) is
reported apart, and the XLA executable cache is counted: a steady loop must compile nothing after warm-up.
DeferAndFuse steps are split into recording (every op through the Python dispatcher, as Strict's are) and
running the captured graphs, the figures that say how far deferring can go below Strict on a given model.

``--models small`` is the small-model suite: Hugging Face architectures (GPT-2, Llama, BERT) built from
``transformers`` configs at tiny sizes (no download), plus the MLP; the median ratio over the suite is printed.

Targets: emulated Strict <= 1.25x plain CPU on the GPT model; compile-xla and defer-and-fuse-xla <= 1.3x plain
CPU on the GPT model and as the median over the small models; defer-and-fuse-xla no slower than Strict.

    python benchmarks/runtime_bench.py [--steps 5] [--warmup 2] [--rounds 2] [--models mlp,gpt] [--threads 1]
    python benchmarks/runtime_bench.py --models small --configs cpu,strict,compile-xla,defer-and-fuse-xla

The ratio that counts is on the best step of each configuration (the one least disturbed by other processes
on a shared machine); medians are printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from hf_step_bench import build as build_tiny_hf  # a sibling script: benchmarks/ is sys.path[0]


@dataclass(frozen=True)
class Config:
    """One column of the comparison: plain CPU, or the emulated device in an eager mode and matmul precision."""

    name: str
    eager_mode: str | None  # None: plain CPU PyTorch, no emulation in the process
    matmul_precision: str | None = None  # torch.set_float32_matmul_precision value; None keeps TorchTPU's default
    compiler: str | None = None  # --compiler for the emulation: "xla" or None (op by op)
    compiled: bool = False  # wrap the model in torch.compile(backend="tpu")


CONFIGS = {
    c.name: c
    for c in (
        Config("cpu", None),
        Config("strict", "strict"),
        # TorchTPU's default rounds f32 matmul inputs to bf16; "highest" shows how much of Strict's cost that is
        Config("strict-highest", "strict", "highest"),
        Config("defer-and-fuse", "defer-and-fuse"),
        Config("compile-xla", "strict", compiler="xla", compiled=True),
        Config("defer-and-fuse-xla", "defer-and-fuse", compiler="xla"),
    )
}
TARGET = {("gpt", "strict"): 1.25, ("gpt", "compile-xla"): 1.3, ("gpt", "defer-and-fuse-xla"): 1.3}
SUITE_TARGET = {"compile-xla": 1.3, "defer-and-fuse-xla": 1.3}  # on the median over the small models
SMALL_MODELS = ("mlp", "hf-gpt2", "hf-llama", "hf-bert")


def build_hf(model_name: str, device: str):  # noqa: ANN201 - torch is imported lazily, in the child
    """A tiny Hugging Face model from its config (random weights, nothing downloaded) and a token batch."""
    import torch

    torch.manual_seed(0)
    model = build_tiny_hf(model_name.removeprefix("hf-"))  # the same tiny models hf_step_bench measures
    model.config.use_cache = False
    tokens = torch.randint(0, 256, (4, 32))
    return model.to(device), tokens.to(device), tokens.to(device), lambda m, a: m(input_ids=a).logits.flatten(0, 1)


def build(model_name: str, device: str):  # noqa: ANN201 - torch is imported lazily, in the child
    import torch
    import torch.nn.functional as F
    from torch import nn

    if model_name.startswith("hf-"):
        return build_hf(model_name, device)
    torch.manual_seed(0)
    if model_name == "mlp":
        layers: list[nn.Module] = []
        for _ in range(8):
            layers += [nn.Linear(64, 64), nn.GELU()]
        model = nn.Sequential(*layers, nn.Linear(64, 10))
        x = torch.randn(16, 64)
        y = torch.randint(0, 10, (16,))
        return model.to(device), x.to(device), y.to(device), lambda m, a: m(a)

    d_model, layers_n, heads, seq, vocab, batch = 512, 6, 8, 256, 2048, 4

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.ln2 = nn.LayerNorm(d_model)
            self.fc = nn.Linear(d_model, 4 * d_model)
            self.out = nn.Linear(4 * d_model, d_model)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            b, t, _ = h.shape
            q, k, v = self.qkv(self.ln1(h)).split(d_model, dim=-1)
            q, k, v = (z.view(b, t, heads, d_model // heads).transpose(1, 2) for z in (q, k, v))
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + self.proj(attn.transpose(1, 2).reshape(b, t, d_model))
            return h + self.out(F.gelu(self.fc(self.ln2(h))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(seq, d_model)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers_n)])
            self.ln = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(idx.shape[1], device=idx.device)
            return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(positions))))

    x = torch.randint(0, vocab, (batch, seq))
    y = torch.randint(0, vocab, (batch, seq))
    return GPT().to(device), x.to(device), y.to(device), lambda m, a: m(a).flatten(0, 1)


def child(model_name: str, config: Config, steps: int, warmup: int, threads: int) -> None:
    """Time ``steps`` training steps after ``warmup`` and print one JSON line."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    device = "cpu"
    if config.eager_mode is not None:
        from tpu_agent.runtime.api import activate

        activate()
        device = "tpu"
        if config.matmul_precision is not None:
            torch.set_float32_matmul_precision(config.matmul_precision)

    graph_runs = [0.0]
    if config.eager_mode == "defer-and-fuse":
        _time_graph_runs(graph_runs)
    model, x, y, forward = build(model_name, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_model = torch.compile(model, backend="tpu") if config.compiled else model
    times, runs_s, first_step_s, compiles_after_warmup = [], [], 0.0, 0
    for step in range(warmup + steps):
        graph_runs[0] = 0.0
        start = time.perf_counter()
        loss = F.cross_entropy(forward(step_model, x), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        if step == 0:
            first_step_s = time.perf_counter() - start
        if step == warmup - 1:
            compiles_after_warmup = _xla_stats().get("compiles", 0)
        if step >= warmup:
            times.append(time.perf_counter() - start)
            runs_s.append(graph_runs[0])
    best = min(range(len(times)), key=times.__getitem__)
    best_runs_s = runs_s[best]
    times.sort()
    stats = _xla_stats()
    print(
        json.dumps(
            {
                "model": model_name,
                "config": config.name,
                "median_s": times[len(times) // 2],
                "min_s": times[0],
                "graph_runs_s": best_runs_s,  # of the best step, the time DeferAndFuse spent running graphs
                "first_step_s": first_step_s,
                "xla_compiles": stats.get("compiles", 0),
                "xla_steady_compiles": stats.get("compiles", 0) - compiles_after_warmup,
                "xla_hits": stats.get("hits", 0),
                "xla_compile_s": stats.get("compile_ns", 0) / 1e9,
            }
        )
    )


def _time_graph_runs(total: list[float]) -> None:
    """Add the seconds DeferAndFuse spends running its captured graphs to ``total[0]`` (the executor's ``run``,
    timed where the runtime makes the executor): the rest of a step is recording and what runs outside graphs."""
    from tpu_agent.runtime.emulated import deferred

    make_executor = deferred.executor_factory

    def timed_executor():  # noqa: ANN202 - an Executor; the protocol lives in the child's lazily imported runtime
        executor = make_executor()
        run = executor.run

        def timed_run(graph: object, cause: str) -> None:
            start = time.perf_counter()
            try:
                run(graph, cause)
            finally:
                total[0] += time.perf_counter() - start

        executor.run = timed_run
        return executor

    deferred.executor_factory = timed_executor


def _xla_stats() -> dict[str, int]:
    """The XLA executable cache's counters, when this process compiled through XLA (else empty)."""
    module = sys.modules.get("tpu_agent.runtime.xla.cache")
    if module is None:
        return {}
    stats = module.executables.stats
    return {"compiles": stats.compiles, "hits": stats.hits, "compile_ns": stats.compile_ns}


def run_child(model_name: str, config: Config, steps: int, warmup: int, threads: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPU_AGENT_"))}
    if config.eager_mode is not None:
        from tpu_agent.runtime.envvars import BACKEND_ENV, eager_mode_env

        env[BACKEND_ENV] = "emulated"
        env.update({k: v for k, v in eager_mode_env(config.eager_mode).items() if v is not None})
    if config.compiler is not None:
        from tpu_agent.runtime.envvars import XLA_PERSIST_ENV
        from tpu_agent.runtime.xla.settings import COMPILER_ENV

        env[COMPILER_ENV] = config.compiler
        env[XLA_PERSIST_ENV] = "0"  # the first step compiles from scratch in every run, not from an earlier run's cache
    result = subprocess.run(
        [sys.executable, __file__, "--child", model_name, config.name, "--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        # one failing configuration is reported, not fatal: the others still give their figures
        print(
            f"{model_name}/{config.name} failed: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else result.returncode}"
        )
        return {"median_s": float("nan"), "min_s": float("nan"), "failed": True}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--models", default="mlp,gpt")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions of every configuration")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads in every configuration (same for all)")
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"subset of {', '.join(CONFIGS)}; cpu is the baseline"
    )
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], CONFIGS[args.child[1]], args.steps, args.warmup, args.threads)
        return
    print(
        f"{args.threads} intra-op thread(s) everywhere; {args.rounds} interleaved rounds of {args.steps} steps after {args.warmup} warm-up"
    )
    print(
        f"{'model':<9} {'config':<19} {'best step':>10} {'vs cpu':>7} {'median':>10} {'vs cpu':>7}  target (on best) / XLA cache"
    )
    names = ["cpu", *(name for name in args.configs.split(",") if name != "cpu")]
    models = list(SMALL_MODELS) if args.models == "small" else args.models.split(",")
    suite_ratios: dict[str, list[float]] = {name: [] for name in names}
    for model_name in models:
        # Rounds interleave the configurations, so a burst of load from other processes hits all of them.
        runs = [
            [run_child(model_name, CONFIGS[name], args.steps, args.warmup, args.threads) for name in names]
            for _ in range(args.rounds)
        ]
        best = {name: min(r[i]["min_s"] for r in runs) for i, name in enumerate(names)}
        median = {name: sorted(r[i]["median_s"] for r in runs)[len(runs) // 2] for i, name in enumerate(names)}
        for i, name in enumerate(names):
            ratio, median_ratio = best[name] / best["cpu"], median[name] / median["cpu"]
            suite_ratios[name].append(ratio)
            target = TARGET.get((model_name, name))
            verdict = "" if target is None else f"<= {target}x {'met' if ratio <= target else 'MISSED'}"
            if name.endswith("-xla") and not runs[0][i].get("failed"):
                last = runs[-1][i]
                verdict += (
                    f" first step {last['first_step_s']:.1f}s ({last['xla_compile_s']:.1f}s compiling {last['xla_compiles']} executables),"
                    f" {last['xla_hits']} cache hits, {last['xla_steady_compiles']} compiles after warm-up"
                )
            if name.startswith("defer-and-fuse") and not all(r[i].get("failed") for r in runs):
                best_run = min((r[i] for r in runs if not r[i].get("failed")), key=lambda result: result["min_s"])
                recording = best[name] - best_run["graph_runs_s"]
                verdict += (
                    f"{';' if verdict else ''} best step: recording {recording * 1e3:.1f}ms ({recording / best['cpu']:.2f}x cpu's"
                    f" whole step), running graphs {best_run['graph_runs_s'] * 1e3:.1f}ms"
                )
            if name == "defer-and-fuse-xla" and "strict" in best:
                verdict += f"; vs strict {best[name] / best['strict']:.2f}x ({'met' if best[name] <= best['strict'] else 'MISSED'} <= 1x)"
            print(
                f"{model_name:<9} {name:<19} {best[name] * 1e3:>8.1f}ms {ratio:>6.2f}x {median[name] * 1e3:>8.1f}ms {median_ratio:>6.2f}x  {verdict}",
                flush=True,
            )
    if len(models) > 1:
        for name in names[1:]:
            ratios = sorted(suite_ratios[name])
            median_ratio = (
                ratios[len(ratios) // 2]
                if len(ratios) % 2
                else (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2
            )
            target = SUITE_TARGET.get(name)
            verdict = "" if target is None else f"<= {target}x {'met' if median_ratio <= target else 'MISSED'}"
            print(f"{'median':<9} {name:<19} {'':>10} {median_ratio:>6.2f}x over {', '.join(models)}  {verdict}")


if __name__ == "__main__":
    main()
