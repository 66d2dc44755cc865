"""Real compiled TPU programs for the compiled-program diagnostics (SH-4, SD-3, SD-4): tiny JAX training steps
AOT-compiled by libtpu (deviceless), read back exactly as ``tpu-agent profile`` reads its ``compiled.json``.

Each test module compiles its programs once (module-scoped fixtures); conftest points the compile cache at a
per-session directory, so nothing is read from or written to the user's cache.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_agent.chips import get_chip, parse_target
from tpu_agent.profile.compiled import CompiledStep, compiled_step
from tpu_agent.profile.model import ProfileModel, RankProfile, RunConfig, Weight
from tpu_agent.runtime.events import Site

SCRIPT = """import torch

model = torch.nn.Linear({inputs}, {outputs})  # LAYER
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    batch = torch.randn({batch}, {inputs}, device="tpu")
    loss = model(batch).square().mean()  # FORWARD
    loss.backward()
    optimizer.step()
"""


def sgd_step(jnp: Any, jax: Any) -> Callable[..., Any]:
    """One training step of a bias-free Linear under SGD, over a PyTorch-layout weight (out, in)."""

    def step(weight: Any, batch: Any) -> Any:
        grad = jax.grad(lambda w: jnp.mean(jnp.square(batch @ w.T)))(weight)
        return weight - 0.1 * grad

    return step


def compile_linear_step(
    target: str, inputs: int, outputs: int, batch: int, strategy: str = "as-captured", dtype: str = "float32"
) -> dict[str, Any]:
    """The estimate document of a Linear(inputs, outputs) SGD step on ``batch`` rows, compiled for ``target``."""
    import jax
    import jax.numpy as jnp

    from tpu_agent.estimate import ArgRole, ArgSpec, StepProgram, estimate_step

    program = StepProgram(
        "train_step",
        sgd_step(jnp, jax),
        (
            ArgSpec("weight", (outputs, inputs), dtype, ArgRole.PARAMETER),
            ArgSpec("batch", (batch, inputs), dtype, ArgRole.BATCH, shard_dim=0),
        ),
        donated=(0,),
    )
    return document(estimate_step([program], parse_target(target), strategy).to_dict())


def document(estimate: dict[str, Any]) -> dict[str, Any]:
    """``estimate`` wrapped as ``tpu-agent estimate --format json`` writes it (and profile keeps it)."""
    return json.loads(json.dumps({"schema_version": 1, "script": "train.py", "estimate": estimate}))


def linear_model(
    tmp_path: Path, compiled: CompiledStep | dict[str, Any], inputs: int, outputs: int, batch: int
) -> tuple[ProfileModel, Path]:
    """A profile model of the script that trains that Linear, carrying the compiled step, and the script."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(inputs=inputs, outputs=outputs, batch=batch), encoding="utf-8")
    lines = script.read_text(encoding="utf-8").splitlines()
    layer = next(n for n, text in enumerate(lines, start=1) if "# LAYER" in text)
    forward = next(n for n, text in enumerate(lines, start=1) if "# FORWARD" in text)
    step = compiled if isinstance(compiled, CompiledStep) else compiled_step(compiled)
    rank = RankProfile(
        rank=0,
        weights=[Weight("model", "Linear", (outputs, inputs), "float32", Site(str(script), layer, "<module>"))],
        module_types=["Linear"],
        forward_site=Site(str(script), forward, "<module>"),
    )
    config = RunConfig(chip=get_chip(step.target), world_size=step.chips)
    return ProfileModel(config=config, ranks={0: rank}, compiled=step), script


def line_of(script: Path, marker: str) -> int:
    return next(n for n, text in enumerate(script.read_text(encoding="utf-8").splitlines(), start=1) if marker in text)
