"""The on-disk cache of compiled results: a re-run reads the compiler's answers instead of compiling, and a
damaged or crafted entry is a miss, never trusted."""

from __future__ import annotations

from pathlib import Path

import pytest
from tpu_compiler import needs_tpu_compiler

from tpu_agent.chips import parse_target
from tpu_agent.estimate import compiler
from tpu_agent.fsutil import CACHE_DIR_ENV

pytestmark = [needs_tpu_compiler, pytest.mark.slow]


def _program() -> tuple[object, list[object]]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(compiler.tpu_devices(parse_target("v5e"))), ("chips",))
    spec = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
    return (lambda a, b: jnp.tanh(a @ b.T)), [spec, spec]


def test_second_compile_is_read_from_the_cache_and_bad_entries_are_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    fn, args = _program()
    first = compiler.compile_for_target(fn, args, parse_target("v5e"))
    (entry,) = (tmp_path / "estimate").glob("*.json")
    assert first.cost["flops"] >= 2 * 256 * 256 * 512 and first.memory["temp"] >= 0
    calls: list[object] = []
    monkeypatch.setattr(compiler, "_store", lambda key, result: calls.append(result))
    again = compiler.compile_for_target(fn, args, parse_target("v5e"))
    assert again == first and calls == []  # served from disk: nothing compiled, nothing stored
    for crafted in ('{"cost": "x"}', "not json", '{"refused": {"message": 1}}', ""):
        entry.write_text(crafted)
        rebuilt = compiler.compile_for_target(fn, args, parse_target("v5e"))
        assert rebuilt.cost == first.cost and len(calls) == 1  # compiled again and stored again
        calls.clear()
