"""Compiled executables persist between runs (tpu_agent.runtime.xla.jax_setup): a second run of the same script
loads what the first compiled, with the same results; switched off, or without a usable directory, none is used.

The runs train a one-layer model (:data:`TRAIN`): what persists is every executable the run compiles, whatever its
size (jax_setup keeps every compile, however quick), so a few small graphs check it as well as a transformer's,
without paying for tracing and compiling a transformer twice."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jax
import pytest
from runtime_launch_util import clean_env

from tpu_agent.fsutil import CACHE_DIR_ENV
from tpu_agent.runtime.envvars import TIER2_CACHE_ENV, XLA_PERSIST_ENV
from tpu_agent.runtime.xla import jax_setup

REPO = Path(__file__).resolve().parents[2]

# Two DeferAndFuse training steps through XLA: the forward, the backward with its gradients and SGD's update are
# deferred graphs, each an XLA executable; prints the losses and how many executables the run compiled.
TRAIN = """
import json, torch
from tpu_agent.runtime.api import activate
activate()
from tpu_agent.runtime.xla import cache
torch.set_float32_matmul_precision("highest")
torch.manual_seed(0)
model = torch.nn.Linear(8, 4).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
inputs = torch.randn(16, 8)
losses = []
for _ in range(2):
    loss = model(inputs.to("tpu")).tanh().square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
print(json.dumps({"tpu": losses, "cache": {"compiles": cache.executables.stats.compiles}}))
"""


def train(cache_dir: Path, **extra_env: str) -> dict:
    """:data:`TRAIN` in a fresh process, caching under ``cache_dir``: its losses and compile count."""
    script = cache_dir.parent / "train.py"
    script.write_text(TRAIN)
    env = clean_env()
    env.update(
        PYTHONPATH=str(REPO), TPU_AGENT_COMPILER="xla", TORCH_TPU_DEFER_AND_FUSE="1", TPU_AGENT_BACKEND="emulated",
        **{CACHE_DIR_ENV: str(cache_dir)}, **extra_env,
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "persistent compilation cache" not in proc.stderr.lower(), proc.stderr[-4000:]  # no cache warnings
    return json.loads(proc.stdout.strip().splitlines()[-1])


def entries(directory: Path, pattern: str = "*-cache") -> dict[str, int]:
    """The cache's executables and when each was written (an entry compiled again is written again)."""
    return {path.name: path.stat().st_mtime_ns for path in directory.glob(pattern)}


@pytest.mark.slow
def test_a_second_run_loads_the_executables_the_first_compiled(tmp_path: Path) -> None:
    """Through TorchTPU's tier-2 cache, named as TorchTPU names it: TORCH_TPU_TIER2_COMPILATION_CACHE=<name> keeps
    the run's executables as <root>/<name>/*.bin (root /dev/shm/torch_tpu_cache, moved here), and the first run's
    XLA_FLAGS --xla_dump_to gets each compiled executable's HLO text. (Without a name the same cache lives in
    tpu-agent's own folder: test_switched_off_nothing_is_set_up checks where.)"""
    cache_dir, root, dumps = tmp_path / "cache", tmp_path / "shm", tmp_path / "hlo"
    tier2 = {TIER2_CACHE_ENV: "mine", "TPU_AGENT_TIER2_ROOT": str(root)}
    first = train(cache_dir, XLA_FLAGS=f"--xla_dump_hlo_as_text --xla_dump_to={dumps}", **tier2)
    written = entries(root / "mine", "*.bin")
    assert len(written) >= first["cache"]["compiles"] > 0  # every executable the run compiled, kept
    assert (root / "mine").stat().st_mode & 0o077 == 0  # the user's own: others cannot plant entries
    assert not (cache_dir / "xla").exists()  # the tier-2 folder instead of tpu-agent's own
    texts = list(dumps.glob("*before_optimizations.txt"))
    assert texts and "HloModule" in texts[0].read_text()
    second = train(cache_dir, **tier2)
    assert entries(root / "mine", "*.bin") == written  # everything it needed was there: nothing compiled anew
    assert second["tpu"] == first["tpu"]


@pytest.fixture
def unset_jax_cache() -> Iterator[None]:
    """This process's JAX cache settings, as they were before and after the test."""
    saved = {name: getattr(jax.config, name) for name in _SETTINGS}
    jax.config.update("jax_compilation_cache_dir", None)
    yield
    for name, value in saved.items():
        jax.config.update(name, value)


_SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_compilation_cache_max_size",
)


@pytest.mark.parametrize("switch", [(XLA_PERSIST_ENV, "0"), (TIER2_CACHE_ENV, "disabled")])
def test_switched_off_nothing_is_set_up(
    switch: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unset_jax_cache: None
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(*switch)
    jax_setup.persist_executables()
    assert jax.config.jax_compilation_cache_dir is None and entries(tmp_path / "xla") == {}
    monkeypatch.delenv(switch[0])
    jax_setup.persist_executables()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")


def test_a_cache_directory_that_cannot_be_made_leaves_the_cache_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unset_jax_cache: None
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker))
    monkeypatch.delenv(XLA_PERSIST_ENV, raising=False)
    jax_setup.persist_executables()  # no error: the run goes on, compiling as without a cache
    assert jax.config.jax_compilation_cache_dir is None


def test_a_tier2_name_points_the_cache_at_its_folder_with_bin_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unset_jax_cache: None
) -> None:
    from jax._src import lru_cache

    monkeypatch.setattr(lru_cache, "_CACHE_SUFFIX", lru_cache._CACHE_SUFFIX)  # restored after the test
    monkeypatch.delenv(XLA_PERSIST_ENV, raising=False)
    monkeypatch.setenv(TIER2_CACHE_ENV, "default")
    monkeypatch.setenv("TPU_AGENT_TIER2_ROOT", str(tmp_path))
    jax_setup.persist_executables()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "default")
    assert lru_cache._CACHE_SUFFIX == ".bin"
    assert jax.config.jax_compilation_cache_max_size == jax_setup.MAX_CACHE_BYTES  # bounded, in RAM-backed /dev/shm


@pytest.mark.parametrize("planted", ["writable by others", "a symlink"])
def test_a_tier2_folder_another_user_could_write_is_not_used(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    unset_jax_cache: None,
    planted: str,
) -> None:
    """Executables are loaded from the tier-2 folder and run: in /dev/shm anyone can create or swap it first."""
    root, elsewhere = tmp_path / "shm", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    if planted == "a symlink":
        (root / "default").symlink_to(elsewhere)
    else:
        (root / "default").mkdir()
        (root / "default").chmod(0o777)
    monkeypatch.delenv(XLA_PERSIST_ENV, raising=False)
    monkeypatch.setenv(TIER2_CACHE_ENV, "default")
    monkeypatch.setenv("TPU_AGENT_TIER2_ROOT", str(root))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "own"))
    jax_setup.persist_executables()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "own" / "xla")
    assert "tier-2 cache not used" in capsys.readouterr().err
