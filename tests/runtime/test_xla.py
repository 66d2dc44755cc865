"""The XLA compiler path of the emulated device (``--compiler xla``): real torch, real JAX/XLA, fresh processes
for anything that activates the device; results compared with plain CPU torch and with Strict mode."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from runtime_launch_util import clean_env

from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.xla import extra_ops, settings
from tpu_agent.runtime.xla.decompositions import table

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


def run_xla_script(name: str, *args: str, events_dir: Path) -> dict:
    env = clean_env()
    env.update(PYTHONPATH=str(REPO), TPU_AGENT_COMPILER="xla", TPU_AGENT_EVENTS_DIR=str(events_dir))
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        capture_output=True, text=True, check=False, env=env, timeout=600, cwd=SCRIPTS,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-4000:]  # e.g. a tensor finaliser at shutdown
    assert "jax_enable_x64" not in proc.stderr, proc.stderr[-4000:]  # 64-bit types run as they are: no narrowing
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("sizes", "strides", "offset"),
    [
        ((3, 4), (4, 1), 0),
        ((4, 3), (1, 4), 0),
        ((3, 4), (4, 1), 7),
        ((2, 3, 4), (12, 1, 3), 0),
        ((3, 4), (0, 1), 5),
        ((1, 5), (99, 1), 2),
    ],
)
def test_strided_views_lower_to_slices_that_match_torch(sizes: tuple, strides: tuple, offset: int) -> None:
    base = torch.arange(60.0)
    view = extra_ops.as_strided(jnp.asarray(base.numpy()), sizes, strides, offset)
    assert view is not None
    np.testing.assert_array_equal(np.asarray(view), base.as_strided(sizes, strides, offset).numpy())
    if 0 not in strides:
        src = torch.randn(sizes)
        scattered = extra_ops.as_strided_scatter(
            jnp.asarray(base.numpy()), jnp.asarray(src.numpy()), sizes, strides, offset
        )
        np.testing.assert_array_equal(
            np.asarray(scattered), torch.as_strided_scatter(base, src, sizes, strides, offset).numpy()
        )


def test_compiled_results_keep_the_layout_their_trace_gave_them() -> None:
    """XLA returns dense row-major arrays. A result the trace gave other strides (a transposed activation that
    AOTAutograd saves and the backward graph then ``view``s as traced: FocalNet, Segformer) comes back with those
    strides, and the same values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tpu_agent.runtime.emulated import state
    from tpu_agent.runtime.xla import lowering

    x = torch.randn(3, 4)

    def graph(a: torch.Tensor) -> list[torch.Tensor]:
        return [(a * 2).t(), (a + 1).permute(1, 0).contiguous(), a.exp()]

    gm = make_fx(graph, tracing_mode="fake")(x)
    results = lowering.compile_graph(gm, [x], state.Precision.HIGHEST)([x])
    for result, expected in zip(results, graph(x), strict=True):
        assert result.stride() == expected.stride()
        torch.testing.assert_close(result, expected)


def test_overlapping_strides_are_left_to_the_general_lowering() -> None:
    assert extra_ops.as_strided(jnp.zeros(16), (3, 3), (2, 1), 0) is None


def test_foreach_ops_decompose_to_per_tensor_loops_with_keyword_scalars() -> None:
    xs, ys, zs = (
        [torch.randn(3), torch.randn(2)],
        [torch.randn(3), torch.randn(2)],
        [torch.rand(3) + 1, torch.rand(2) + 1],
    )
    loop = table()[torch.ops.aten._foreach_addcdiv.ScalarList]
    expected = torch._foreach_addcdiv(xs, ys, zs, [0.5, 2.0])
    for got, want in zip(loop(xs, ys, zs, [0.5, 2.0]), expected, strict=True):
        torch.testing.assert_close(got, want)
    inplace = [x.clone() for x in xs]
    assert table()[torch.ops.aten._foreach_mul_.Scalar](inplace, 3.0) is None
    for got, x in zip(inplace, xs, strict=True):
        torch.testing.assert_close(got, x * 3)


def test_the_ops_after_an_eager_multi_output_op_still_compile() -> None:
    """An op with no lowering that returns a tuple (``geqrf``; ``convolution_backward`` was one until it got its
    lowering): its segment hands the next one the tensors (it handed over the tuple, and Qwen3.5's backward ran its
    last 74 ops op by op at every step)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tpu_agent.runtime.emulated import state
    from tpu_agent.runtime.xla import cache, graphs

    def factor(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        reflectors, tau = torch.ops.aten.geqrf(x @ w)
        return (reflectors * 2).tanh().sum(), tau.square() + 1

    x, w = torch.randn(3, 6, 5), torch.randn(5, 4)
    runner = graphs.GraphRunner(make_fx(factor)(x, w), "multi-output", precision=state.Precision.HIGHEST)
    assert runner.split is not None
    compiles = cache.executables.stats.compiles
    got = runner(x, w)
    assert cache.executables.stats.compiles > compiles  # the segment after the eager op is an executable
    for got_value, expected in zip(got, factor(x, w), strict=True):
        torch.testing.assert_close(got_value, expected, rtol=1e-5, atol=1e-5)


def test_gelu_lowers_to_torchs_formula() -> None:
    x = torch.linspace(-12, 12, 2001)
    for approximate in ("none", "tanh"):
        lowered = jax.jit(functools.partial(extra_ops.gelu, approximate=approximate))(jnp.asarray(x.numpy()))
        expected = torch.nn.functional.gelu(x, approximate=approximate).numpy()
        np.testing.assert_allclose(np.asarray(lowered), expected, rtol=2e-6, atol=1e-6)


def test_compiler_switch_refuses_unknown_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.COMPILER_ENV, "XLA")
    assert settings.uses_xla()
    monkeypatch.setenv(settings.COMPILER_ENV, "tvm")
    with pytest.raises(TpuAgentError, match="TPU_AGENT_COMPILER='tvm' is not a compiler") as refused:
        settings.compiler()
    assert refused.value.hint.startswith("use one of xla, eager")


@pytest.mark.parametrize("python", [(3, 10, 14), (3, 12, 1)])
def test_xla_without_torchax_is_refused_with_what_to_do(
    python: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Python 3.10 cannot install torchax: ``run --compiler xla`` says so before any rank starts, no traceback."""
    from typer.testing import CliRunner

    from tpu_agent.cli import app

    monkeypatch.setitem(sys.modules, "torchax", None)  # Python's own "this import is blocked"
    monkeypatch.setattr(sys, "version_info", python)
    monkeypatch.delenv(settings.COMPILER_ENV, raising=False)
    assert settings.missing_xla_packages() == ["torchax"]
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('never launched')\n")
    result = CliRunner().invoke(app, ["run", "--backend", "emulated", "--compiler", "xla", str(script)])
    assert result.exit_code == 2, result.output
    assert "--compiler xla selects the XLA compiler, but torchax cannot be imported" in result.output
    expected_hint = "needs Python >= 3.11" if python < (3, 11) else "pip install 'torchax>=0.0.13'"
    assert expected_hint in result.output and "--compiler eager" in result.output
    assert "Traceback" not in result.output and "never launched" not in result.output
    assert settings.compiler() == settings.EAGER  # without an explicit choice: the op-by-op path, no error


TRAINING_RUNS = ("compile:highest:4", "defer:highest:4", "compile:medium:2")


@pytest.fixture(scope="module")
def training_runs(run_once: Callable[..., Any]) -> dict:
    """The training script's runs in one process: one start-up and JIT warm-up for every assertion below, once per
    session (run_once), also when pytest-xdist splits this module between workers."""
    return run_once(
        "xla-training-runs", lambda events_dir: run_xla_script("xla_train.py", *TRAINING_RUNS, events_dir=events_dir)
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["compile", "defer"])
def test_training_through_xla_matches_cpu_and_compiles_once(mode: str, training_runs: dict) -> None:
    out = training_runs[f"{mode}:highest:4"]
    np.testing.assert_allclose(out["tpu"], out["cpu"], rtol=2e-6, atol=2e-6)
    assert out["max_param_diff"] < 5e-3  # AdamW normalises tiny gradient differences up to ~lr
    assert out["fallbacks"] == [] and out["graph_breaks"] == []
    if mode == "compile":  # one whole graph each way: forward and backward, every step
        assert out["cache"]["requests"] == 2 * 4
    assert out["compile_events"] == out["cache"]["compiles"] > 0
    # the first steps compile (optimizer state appears in step 1); the steady loop only hits the cache
    assert out["compiles_after_step"][-1] == out["compiles_after_step"][1]
    assert out["cache_hit_events"] == out["cache"]["hits"] >= 2


@pytest.mark.slow
def test_default_precision_rounds_matmul_inputs_like_strict_mode(training_runs: dict) -> None:
    out = training_runs["compile:medium:2"]
    assert out["tpu"][0] != pytest.approx(out["cpu"][0], abs=1e-7)  # bf16 inputs: not the f32 CPU result
    np.testing.assert_allclose(out["tpu"], out["cpu"], rtol=5e-3)
    assert out["cache"]["compiles"] > 0  # a new precision is a new executable, not a hit on the f32 one


@pytest.mark.slow
def test_views_mutation_optimizer_rng_and_fallbacks_keep_their_meaning(tmp_path: Path) -> None:
    out = run_xla_script("xla_semantics.py", events_dir=tmp_path)
    strict_views, fused_views = out["views"]
    assert fused_views == strict_views
    assert out["data_dependent"][0] == out["data_dependent"][1] == [[2.0, 4.0], [[0], [2]]]
    torch.manual_seed(0)
    torch.randn(1, 2, 8, 4)
    assert out["host_stream"][0] == out["host_stream"][1] == torch.randint(100, (4,)).tolist()  # batch order kept
    (strict_losses, strict_params), (fused_losses, fused_params) = out["optimizer"]
    np.testing.assert_allclose(fused_losses, strict_losses, rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(fused_params), np.concatenate(strict_params), rtol=1e-5, atol=1e-6)
    (strict_losses, strict_history, _), (fused_losses, fused_history, compiles) = out["sliding"]
    np.testing.assert_allclose(fused_losses, strict_losses, rtol=1e-6)
    np.testing.assert_allclose(fused_history, strict_history, rtol=1e-6)
    assert compiles[-1] == compiles[2]  # a batch at a new offset of the same dataset is not a new program
    (strict_chunks, strict_compiled), (fused_chunks, fused_compiled) = out["chunks"]
    assert fused_chunks == strict_chunks == strict_compiled == fused_compiled
    compiled = out["compiled"]
    # no lowering: eager for that op, same draws (a different draw moves the sum by 2 or more; XLA sums the rest
    # in its own order)
    assert compiled["poisson"][1] == pytest.approx(compiled["poisson"][0], rel=1e-6)
    assert compiled["dropout_reproducible"] and compiled["dropout_fresh"] and compiled["dropout_scale"]
    assert 0.3 < compiled["dropout_rate"] < 0.7
    poisson_line = next(
        i for i, t in enumerate((SCRIPTS / "xla_semantics.py").read_text().splitlines(), 1) if "# LINE poisson" in t
    )
    assert ["aten.poisson.default", "xla_semantics.py", poisson_line] in out["fallbacks"]
    (cpu_loss, cpu_grad), (tpu_loss, tpu_grad) = out["data_dependent_in_graph"]
    assert tpu_loss == pytest.approx(cpu_loss, rel=1e-6)
    np.testing.assert_allclose(tpu_grad, cpu_grad, rtol=1e-6, atol=1e-7)
    masked_line = next(
        i
        for i, t in enumerate((SCRIPTS / "xla_semantics.py").read_text().splitlines(), 1)
        if "# LINE masked_select" in t
    )
    assert ["aten.masked_select.default", "xla_semantics.py", masked_line] in out["fallbacks"]
    assert all(0.15 < rate < 0.35 for rate in out["deferred_dropout"])
    # an input the compiled graph writes into and returns gets its gradient on the device (it was a CPU gradient
    # that failed the backward of transformers' GPT-OSS), with CPU's values
    cpu_runs, tpu_runs = out["written_input"][:2], out["written_input"][2:]
    for (cpu_device, cpu_x, cpu_bias), (tpu_device, tpu_x, tpu_bias) in zip(cpu_runs, tpu_runs, strict=True):
        assert (cpu_device, tpu_device) == ("cpu", "tpu")
        np.testing.assert_allclose(tpu_x, cpu_x, rtol=1e-6)
        np.testing.assert_allclose(tpu_bias, cpu_bias, rtol=1e-6)
    # a complex multiply's backward conjugates (a bit on a view, not in the storage): its graph runs op by op, with
    # Strict's values (through XLA the gradient came out wrong by its own size)
    (strict_out, strict_grad), (fused_out, fused_grad) = out["complex_rotary"]
    np.testing.assert_allclose(fused_out, strict_out, rtol=1e-6)
    np.testing.assert_allclose(fused_grad, strict_grad, rtol=1e-6, atol=1e-6)
    # every deferred graph compiled but the one whose as_strided reads the storage under a view (chunks) and the
    # conjugating backward
    deferred = sorted(f[0] for f in out["fallbacks"] if f[0].startswith("deferred graph"))
    assert len(deferred) == 2, deferred
    assert any("NotPlannable: as_strided on a view" in f for f in deferred), deferred
    assert any("conj" in f.split("NotPlannable: ", 1)[-1] for f in deferred), deferred


LIVENESS_SCRIPT = """
import json, torch
from tpu_agent.runtime.api import activate
activate()
from tpu_agent.runtime.xla import planning
torch.set_float32_matmul_precision("highest")  # the CPU's f32 matmul, so values compare closely

planned, recalled = [], []
def spy(graph):
    graph_plan = plan(graph)
    planned.append(len(graph_plan.outputs))
    if graph_plan.slots is None:  # recalled from a graph of the same structure: planning it must agree
        full = planning.complete(graph, graph_plan)
        recalled.append(
            (full.key, [id(t) for t in full.outputs], full.floats, [b.data_ptr() for b in full.buffers])
            == (graph_plan.key, [id(t) for t in graph_plan.outputs], graph_plan.floats, [b.data_ptr() for b in graph_plan.buffers])
        )
    return graph_plan
plan, planning.plan = planning.plan, spy

torch.manual_seed(0)
w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8)
tw, tx = w.detach().to("tpu").requires_grad_(), x.to("tpu")
tw.sum().item()

def step(a, b):
    hidden = (a @ b).tanh()  # saved for backward: live across the first flush
    view = (hidden * 3).t()  # a live view of a dead base
    total = ((hidden + 1) * 2).sum()  # the sum and product: dead once summed (autograd saves neither)
    return hidden, view, total

hidden, view, total = step(tx, tw)
total.item()
first = planned[-1]
total.backward()
loss_value = total.item()
expected = step(x, w)
expected[2].backward()
again = step(tx, tw)  # the first graph again: its plan is recalled
again_value = again[2].item()
print(json.dumps({
    "outputs": planned,
    "first": first,
    "recalled": recalled,
    "again": abs(again_value - loss_value) < 1e-6,
    "values": [torch.allclose(t.cpu(), e.detach(), atol=1e-5) for t, e in zip((hidden, view, total), expected)],
    "grad": torch.allclose(tw.grad.cpu(), w.grad, atol=1e-5),
    "loss": abs(loss_value - expected[2].item()) < 1e-4,
}))
"""


@pytest.mark.slow
def test_deferred_graphs_return_only_what_the_program_can_still_read(tmp_path: Path) -> None:
    """A DeferAndFuse graph's executable returns the tensors still referenced after the flush (variables, autograd's
    saved tensors, a live view's base), not every intermediate: XLA fuses those away."""
    script = tmp_path / "liveness.py"
    script.write_text(LIVENESS_SCRIPT)
    env = clean_env()
    env.update(
        PYTHONPATH=str(REPO), TPU_AGENT_COMPILER="xla", TORCH_TPU_DEFER_AND_FUSE="1", TPU_AGENT_BACKEND="emulated"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # forward: mm, tanh (hidden), mul, t (view), add, mul, sum: hidden, the view's base and total come out; the
    # matmul's product (tanh saves its result, not its input), the add and the mul stay inside the executable
    assert out["first"] == 3, out["outputs"]
    # the repeated step's graph took its plan from the first one's fingerprint, and planning it agrees
    assert out["recalled"] == [True] and out["again"] and out["outputs"][-1] == 3, out
    assert out["values"] == [True, True, True] and out["grad"] and out["loss"]


@pytest.mark.slow
def test_two_ranks_train_a_compiled_model_with_tpu_dist_collectives(tmp_path: Path) -> None:
    env = clean_env()
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "tpu_agent", "run", "--nproc", "2", "--backend", "emulated", "--compiler", "xla"]
    proc = subprocess.run(
        [*command, str(SCRIPTS / "xla_dist.py"), str(tmp_path)],
        capture_output=True, text=True, check=False, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [json.loads((tmp_path / f"results-rank{r}.json").read_text()) for r in range(2)]
    for result in results:
        assert result["grad_diff"] < 1e-6  # averaged shard gradients equal the full-batch CPU gradients
        assert result["collective_in_graph"] == 4 * 1 + 4 * 4 + 1  # both ranks' sums, reduced, then + 1
        assert result["compiles"] >= 2  # forward and backward executables, at least


@pytest.mark.parametrize(
    ("heads", "kv_heads", "causal", "masked"),
    [(4, 4, True, False), (4, 2, False, True), (2, 2, False, False)],
)
def test_fused_cpu_attention_lowers_to_the_kernels_outputs_and_gradients(
    heads: int, kv_heads: int, causal: bool, masked: bool
) -> None:
    """The forward returns the kernel's logsumexp (not attention weights, as torch's decomposition does), so the
    backward op of the same graph computes the kernel's gradients (the DeferAndFuse training regression)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v, grad = (
        torch.randn(2, h, 8 if name != "kv" else 6, 16, generator=generator)
        for h, name in ((heads, "q"), (kv_heads, "kv"), (kv_heads, "kv"), (heads, "q"))
    )
    q_len, kv_len = q.shape[2], k.shape[2]
    mask = torch.randn(q_len, kv_len, generator=generator) if masked else None
    extra = {"attn_mask": mask} if mask is not None else {}
    aten = torch.ops.aten
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, **extra)
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, lse, 0.0, causal, **extra)

    def jax_of(t: torch.Tensor | None) -> jnp.ndarray | None:
        return None if t is None else jnp.asarray(t.numpy())

    # jitted: one XLA compile per case instead of one per eager JAX op (as the lowering runs, inside a trace)
    forward = jax.jit(functools.partial(extra_ops.flash_attention, dropout_p=0.0, is_causal=causal))
    backward = jax.jit(functools.partial(extra_ops.flash_attention_backward, dropout_p=0.0, is_causal=causal))
    j_out, j_lse = forward(jax_of(q), jax_of(k), jax_of(v), attn_mask=jax_of(mask))
    np.testing.assert_allclose(np.asarray(j_out), out.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(j_lse), lse.numpy(), rtol=1e-5, atol=1e-5)
    j_grads = backward(*(jax_of(t) for t in (grad, q, k, v, out, lse)), attn_mask=jax_of(mask))
    for got, want in zip(j_grads, grads, strict=True):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-5)


def test_decompositions_keep_the_fused_attention_whole() -> None:
    """torch's rule for the CPU flash kernel returns (N, H, L, S) weights where the kernel's logsumexp is
    (N, H, L); applied before lowering it fed the backward op the wrong tensor."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    q = torch.empty(2, 3, 5, 4, device="meta")
    expected = [tuple(t.shape) for t in op(q, q, q, 0.0, True)]
    rule = table().get(op)
    assert rule is None or [tuple(t.shape) for t in rule(q, q, q, 0.0, True)] == expected


def test_the_executable_cache_logs_compiles_with_their_time_and_every_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpu_agent.runtime import events
    from tpu_agent.runtime.emulated import compile_cache, state
    from tpu_agent.runtime.xla.cache import ExecutableCache

    requests, hits = compile_cache.requests, compile_cache.hits
    monkeypatch.setattr(events, "_log", events.EventLog(path=tmp_path / "events-rank0.jsonl", rank=0))
    monkeypatch.setattr(state, "log_enabled", True)
    cache, site = ExecutableCache(capacity=2), events.Site("train.py", 7, "step")
    built: list[str] = []

    def get(shape: tuple[int, ...]) -> str:
        return cache.get_or_compile(
            "g", (shape,), lambda: built.append(str(shape)) or str(shape), "step", site, lambda: 3
        )

    assert [get((2,)), get((2,)), get((3,)), get((2,))] == ["(2,)", "(2,)", "(3,)", "(2,)"]
    assert built == ["(2,)", "(3,)"] and (cache.stats.hits, cache.stats.compiles) == (2, 2)
    # what torch.tpu._get_cache_stats() reports under --compiler xla: the same requests and hits
    assert (compile_cache.requests - requests, compile_cache.hits - hits) == (4, 2)
    events.get_log().flush()
    log = events.read_events(tmp_path)[0]
    assert [type(e).__name__ for e in log] == ["Compile", "CacheHit", "Compile", "CacheHit"]
    first, recompile = log[0], log[2]
    assert isinstance(first, events.Compile) and isinstance(recompile, events.Compile)
    assert (first.is_recompile, recompile.is_recompile, first.graph_ops, first.site) == (False, True, 3, site)
    assert first.duration_ns > 0 and "(3,)" in recompile.reason
    assert all(e.function == "step" for e in log if isinstance(e, events.CacheHit))
