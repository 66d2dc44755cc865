"""Triangular solves and Cholesky factorisations compile to HLO that XLA expands, not to jaxlib's LAPACK custom
calls: those block XLA:CPU's thread pool, and independent batched solves in one executable (Qwen3.5's gated delta
rule, forward and backward) hung it forever (tpu_agent.runtime.xla.jax_setup)."""

from __future__ import annotations

import re

import pytest

jax = pytest.importorskip("jax", reason="the XLA compiler's packages are not installed (Python 3.10: see README)")

from tpu_agent.runtime.xla import jax_setup  # noqa: E402 - after the skip above


def _compiled_text() -> str:
    import jax.numpy as jnp
    from jax import lax

    @jax.jit
    def solves(a: jax.Array, bs: list[jax.Array]) -> list[jax.Array]:
        unit_lower = jnp.tril(a, -1) + jnp.eye(a.shape[-1])
        solved = [
            lax.linalg.triangular_solve(unit_lower * (i + 1), b, left_side=True, lower=True, unit_diagonal=True)
            for i, b in enumerate(bs)
        ]
        spd = a @ jnp.swapaxes(a, -1, -2) + a.shape[-1] * jnp.eye(a.shape[-1])
        return [*solved, lax.linalg.cholesky(spd)]

    a = jnp.ones((2, 3, 16, 16)) * 0.1
    return solves.lower(a, [jnp.ones((2, 3, 16, 4))] * 4).compile().as_text()


def test_linear_algebra_compiles_to_hlo_xla_expands_not_lapack_custom_calls() -> None:
    assert jax_setup.expand_linear_algebra_in_xla(), "JAX's generic linalg lowerings moved: update jax_setup"
    text = _compiled_text()
    assert re.findall(r'custom_call_target="([^"]+)"', text) == []  # jaxlib's are lapack_strsm_ffi, lapack_spotrf_ffi
