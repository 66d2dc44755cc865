"""The on-disk cache of compiled results: a re-run reads the compiler's answers instead of compiling, and a
damaged or crafted entry is a miss, never trusted."""

from __future__ import annotations

import os
import subprocess
import sys
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
    full = compiler.compile_for_target(fn, args, parse_target("v5e"), effort="full")
    assert len(calls) == 1 and full.cost["flops"] == first.cost["flops"]  # another effort: compiled, stored apart
    calls.clear()
    for crafted in ('{"cost": "x"}', "not json", '{"refused": {"message": 1}}', ""):
        entry.write_text(crafted)
        rebuilt = compiler.compile_for_target(fn, args, parse_target("v5e"))
        assert rebuilt.cost == first.cost and len(calls) == 1  # compiled again and stored again
        calls.clear()


PERSISTING_PROCESS = """
import json, shutil, sys
from pathlib import Path

from tpu_agent.runtime.xla import jax_setup  # what a run's XLA path does: JAX's persistent cache on

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpu_agent.chips import parse_target
from tpu_agent.estimate import compiler

def doubled(x):
    return x * 2

def tpu_program(a, b):
    return jnp.tanh(a @ b.T)

doubled_jit = jax.jit(doubled)
doubled_jit(jnp.ones(3)).block_until_ready()  # an executable of the run itself: persisted
mesh = Mesh(np.array(compiler.tpu_devices(parse_target("v5e"))), ("chips",))
spec = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
for _ in range(2):  # the second compile would read back what the first wrote
    shutil.rmtree(compiler.cache_dir(), ignore_errors=True)
    compiler.compile_for_target(tpu_program, [spec, spec], parse_target("v5e"))
print(json.dumps(sorted(path.name.split("-")[0] for path in Path(sys.argv[1]).glob("xla/*-cache"))))
"""


def test_tpu_compiles_stay_out_of_the_runs_persistent_executables(tmp_path: Path) -> None:
    """A process whose emulated device persists XLA executables (estimate's capture, profile --tpu-compiler) keeps
    its TPU compiles out of that cache: JAX cannot load a program compiled without a TPU back from it, and would
    warn at every later read."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path)}
    env.pop("TPU_AGENT_XLA_PERSIST", None)
    proc = subprocess.run(
        [sys.executable, "-c", PERSISTING_PROCESS, str(tmp_path)],
        capture_output=True, text=True, check=False, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "persistent compilation cache" not in proc.stderr, proc.stderr[-3000:]
    persisted = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "jit_doubled" in persisted and "jit_tpu_program" not in persisted


COMPILES_AT_ONCE = """
import sys
import threading

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpu_agent.chips import parse_target
from tpu_agent.estimate import compiler

start = threading.Barrier(3)
errors = []

def compile_one(spec, width):
    target = parse_target(spec)
    start.wait()
    try:
        mesh = Mesh(np.array(compiler.tpu_devices(target)), ("chips",))
        shape = jax.ShapeDtypeStruct((64, width), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
        compiler.compile_for_target(lambda a: jnp.tanh(a) * 2, [shape], target)
    except Exception as error:  # noqa: BLE001 - reported below
        errors.append(repr(error))

import jax
threads = [threading.Thread(target=compile_one, args=args) for args in (("v6e-8", 128), ("v5e-4", 256), ("v6e", 384))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(errors)
"""


def test_programs_compile_in_threads_from_a_fresh_process(tmp_path: Path) -> None:
    """Programs compile two at a time, so a process's first requests for a slice's devices and its first compiles
    come from several threads at once; libtpu's plugin is set up once for all of them (a 8B estimate served from
    the cache once failed with "PJRT_Api already exists for device type tpu" before the devices were locked)."""
    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", COMPILES_AT_ONCE], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr[-2000:]
