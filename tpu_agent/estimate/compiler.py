"""The TPU compiler without a TPU: libtpu's deviceless ahead-of-time compilation, driven through JAX.

JAX can describe a TPU slice it is not running on (``jax.experimental.topologies.get_topology_desc``) and
compile a program for that slice's devices with the same compiler (libtpu) that TorchTPU uses on a real host.
The compiled executable is never run; what we keep is what the compiler knows about it: FLOPs, bytes,
``optimal_seconds``, the HBM it needs by kind, and the optimized HLO. MaxText and AXLearn use the same
mechanism for their CPU-only ahead-of-time tests.

libtpu is a ~700 MB Linux x86_64 wheel (the ``[estimate]`` extra);
:func:`tpu_agent.runtime.tpu_compiler.compiler_status` says whether it is usable here and, if not, exactly what
is missing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_agent.chips import CHIPS, SLICE_GENERATIONS, TpuTarget
from tpu_agent.errors import TpuAgentError
from tpu_agent.estimate.options import DEFAULT_EFFORT, EXEC_TIME_EFFORT
from tpu_agent.fsutil import user_cache_dir
from tpu_agent.runtime.tpu_compiler import CompilerStatus, compiler_status

# What libtpu prints on stderr when it starts on a host that is not a TPU VM. It is expected here (there is no
# TPU), says nothing the user can act on, and would bury the script's own output.
_HARMLESS_LIBTPU_LINES = re.compile(
    r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Failed to find host bounds|Source Location Trace|libtpu_init_utils"
    r"|^=+\s*$|common_lib\.cc|could not determine TPU|Unable to initialize backend 'tpu'|^\s*$|^E0000|^W0000|^I0000|Logging before InitGoogle"
)


def require_compiler() -> CompilerStatus:
    """The compiler status, or an actionable error when estimates cannot be compiled here."""
    status = compiler_status()
    if not status.available:
        raise TpuAgentError("tpu-compiler-missing", f"the TPU compiler is not available: {status.reason}", status.hint)
    return status


def supported_chip_counts(generation: str) -> tuple[int, ...]:
    """Chip counts this compiler integration can lay out for ``generation`` (empty: generation unsupported)."""
    chip = CHIPS.get(generation)
    return tuple(chip.slice_grids) if chip is not None else ()


def topology_name(target: TpuTarget) -> tuple[str, tuple[int, int, int]]:
    """libtpu's topology name and chips-per-host bounds for ``target`` (``v5e-4`` -> ``v5e:2x2``, (2, 2, 1)).

    The grid is the chip table's (:attr:`tpu_agent.chips.Chip.slice_grids`). Hosts of a multi-host slice hold
    4 chips, as on Cloud TPU; a single-host v5e / v6e slice holds up to 8.
    """
    grids = target.chip.slice_grids
    if not grids:
        raise TpuAgentError(
            "unsupported-target",
            f"estimates for {target.chip.device_name} are not supported by this libtpu",
            f"use one of: {', '.join(SLICE_GENERATIONS)}",
        )
    grid = grids.get(target.chips)
    if grid is None:
        raise TpuAgentError(
            "unsupported-target",
            f"--chip {target.spec}: a {target.chip.key} slice of {target.chips} chips has no layout here",
            f"use a slice of {', '.join(str(count) for count in grids)} chips, e.g. {target.chip.key}-{min(c for c in grids if c > 1)}",
        )
    if target.chips == 1:
        host_bounds = (1, 1, 1)
    elif target.chips == 8 and len(grids[8].split("x")) == 2:
        host_bounds = (2, 4, 1)
    else:
        host_bounds = (2, 2, 1)
    return f"{target.chip.key}:{grid}", host_bounds


@contextlib.contextmanager
def _quiet_libtpu() -> Iterator[None]:
    """Route file descriptor 2 to a temporary file while libtpu runs, then replay what is not known noise.

    libtpu writes its warnings from C++, below Python's ``sys.stderr``, so only a descriptor-level redirect
    catches them. Anything not on the harmless list (a real compiler error, say) is still shown.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for raw in capture.read().decode("utf-8", "replace").splitlines():
                if not _HARMLESS_LIBTPU_LINES.search(raw):
                    print(raw, file=sys.stderr)


def _jax() -> Any:
    """Import jax for deviceless TPU work: the CPU platform for execution, and no metadata-server lookups."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # deviceless: no chip is opened, so several processes (pytest and a capture child, two users' runs) may
    # load libtpu at once; without this the second one fails on libtpu's lockfile
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax

    jax.config.update("jax_platforms", "cpu")
    return jax


_TOPOLOGY = threading.Lock()  # the first topology initialises libtpu's PJRT plugin, which may happen only once


def tpu_devices(target: TpuTarget) -> tuple[Any, ...]:
    """The (deviceless) TPU devices of ``target``'s slice, as the compiler sees them. Safe from several threads:
    two compiling threads asking at once failed with libtpu's "PJRT_Api already exists for device type tpu"."""
    with _TOPOLOGY:
        return _topology_devices(*topology_name(target))


@functools.lru_cache(maxsize=16)
def _topology_devices(name: str, host_bounds: tuple[int, int, int]) -> tuple[Any, ...]:
    require_compiler()
    _jax()
    from jax.experimental import topologies

    with _quiet_libtpu():
        topology = topologies.get_topology_desc(
            platform="tpu",
            topology_name=name,
            chip_config_name="default",
            chips_per_host_bounds=host_bounds,
            num_slices=1,
        )
    return tuple(topology.devices)


_GIGABYTES = re.compile(r"\(([\d.]+)([KMGT])\)")
_UNIT = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class HbmExhausted(TpuAgentError):
    """The compiler refused the program because it needs more HBM than one chip has: the verdict, not a bug."""

    def __init__(self, message: str, required_bytes: int, available_bytes: int) -> None:
        super().__init__("hbm-exhausted", message, "see the suggestions: sharding, bf16 state, a smaller batch")
        self.required_bytes = required_bytes
        self.available_bytes = available_bytes


def _hbm_exhausted(text: str) -> HbmExhausted | None:
    """Read libtpu's out-of-HBM refusal (``... required ... (16.29G) exceeds available HBM (15.75G)``)."""
    if "RESOURCE_EXHAUSTED" not in text or "HBM" not in text:
        return None
    sizes = [int(float(number) * _UNIT[unit]) for number, unit in _GIGABYTES.findall(text)]
    if len(sizes) < 2:
        return None
    first_line = text.strip().splitlines()[0]
    return HbmExhausted(first_line[:500], required_bytes=sizes[0], available_bytes=sizes[-1])


@dataclass(frozen=True)
class CompiledArtifacts:
    """What the compiler returned for one program: its cost and memory analyses and the optimized HLO."""

    cost: dict[str, float]
    memory: dict[str, int]
    hlo_text: str


CACHE_MAX_ENTRIES = 256
CACHE_MAX_BYTES = 512 * 1024**2


def cache_dir() -> Path:
    """Where compiled results are kept: ``$TPU_AGENT_CACHE_DIR``, else the user's cache directory."""
    return user_cache_dir("estimate")


def _cache_key(lowered_text: str, target: TpuTarget, donate_argnums: Sequence[int], effort: str) -> str:
    """The program as lowered (StableHLO, shardings included), the slice, the effort and the compiler's version."""
    digest = hashlib.sha256(lowered_text.encode())
    digest.update(f"|{target.spec}|{tuple(donate_argnums)}|{effort}|{compiler_status().libtpu_version}".encode())
    return digest.hexdigest()


def _cached(key: str) -> CompiledArtifacts | HbmExhausted | None:
    """A compiled result from the cache; a missing, unreadable or malformed entry is a miss (never trusted)."""
    try:
        entry = json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
        if "refused" in entry:
            refused = entry["refused"]
            return HbmExhausted(str(refused["message"]), int(refused["required"]), int(refused["available"]))
        cost = {str(name): float(value) for name, value in dict(entry["cost"]).items()}
        memory = {name: int(dict(entry["memory"])[name]) for name in ("argument", "output", "alias", "temp", "code")}
        hlo_text = entry["hlo_text"]
        if not isinstance(hlo_text, str):
            return None
        return CompiledArtifacts(cost=cost, memory=memory, hlo_text=hlo_text)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _store(key: str, result: CompiledArtifacts | HbmExhausted) -> None:
    """Write one entry atomically, then trim the cache to its bounds (oldest entries first)."""
    from tpu_agent.fsutil import atomic_write_text

    directory = cache_dir()
    if isinstance(result, HbmExhausted):
        entry: dict[str, Any] = {
            "refused": {
                "message": result.message,
                "required": result.required_bytes,
                "available": result.available_bytes,
            }
        }
    else:
        entry = {"cost": result.cost, "memory": result.memory, "hlo_text": result.hlo_text}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / f"{key}.json", json.dumps(entry))
        entries = sorted(directory.glob("*.json"), key=lambda path: path.stat().st_mtime, reverse=True)
        total = 0
        for index, path in enumerate(entries):
            total += path.stat().st_size
            if index >= CACHE_MAX_ENTRIES or total > CACHE_MAX_BYTES:
                path.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only or full cache directory only costs the next run a compile


@contextlib.contextmanager
def _outside_jax_persistent_cache(jax: Any) -> Iterator[None]:
    """Nothing of a TPU compile goes to JAX's persistent cache (which the emulated device's XLA path may have
    turned on in this process): a program compiled without a TPU cannot be loaded back from it (JAX needs a
    device client to deserialise one, and warns at every later read). This module keeps compiled results itself.
    Entries are keyed by platform and devices, so the compile finds no CPU entry either."""
    setting = "jax_persistent_cache_min_compile_time_secs"
    previous = getattr(jax.config, setting)
    jax.config.update(setting, float("inf"))  # no compile is that slow: none is written
    try:
        yield
    finally:
        jax.config.update(setting, previous)


class _Session:
    """The process-wide settings every compile needs (see :func:`compile_session`), and who holds them."""

    lock = threading.Lock()
    holders = 0
    settings: contextlib.ExitStack | None = None


_LOWERING = threading.Lock()  # tracing a graph to JAX goes through torchax's one environment: one trace at a time


@contextlib.contextmanager
def compile_session() -> Iterator[None]:
    """libtpu's noise filtered from file descriptor 2 and JAX's persistent cache off, for every compile inside,
    from any thread. Both are process-wide, so the first holder sets them and the last restores them: compiles
    in several threads (:func:`tpu_agent.estimate.step.estimate_step`) share one redirect instead of undoing
    each other's."""
    with _Session.lock:
        if _Session.holders == 0:
            settings = contextlib.ExitStack()
            settings.enter_context(_quiet_libtpu())
            settings.enter_context(_outside_jax_persistent_cache(_jax()))
            _Session.settings = settings
        _Session.holders += 1
    try:
        yield
    finally:
        with _Session.lock:
            _Session.holders -= 1
            if _Session.holders == 0 and _Session.settings is not None:
                _Session.settings.close()
                _Session.settings = None


def compile_for_target(
    fn: Callable[..., Any],
    abstract_args: Sequence[Any],
    target: TpuTarget,
    donate_argnums: Sequence[int] = (),
    effort: str = DEFAULT_EFFORT,
) -> CompiledArtifacts:
    """AOT-compile ``fn`` for ``target`` on abstract arguments (``jax.ShapeDtypeStruct`` carrying shardings over
    :func:`tpu_devices`) at ``effort`` (:data:`~tpu_agent.estimate.options.EFFORTS`); nothing is allocated and
    nothing runs. Results (and out-of-HBM refusals) are cached on disk by the lowered program, the target, the
    effort and the compiler's version, so a re-run only lowers."""
    jax = _jax()
    with compile_session():
        with _LOWERING, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            lowered = jax.jit(fn, donate_argnums=tuple(donate_argnums)).lower(*abstract_args)
            key = _cache_key(lowered.as_text(), target, donate_argnums, effort)
        cached = _cached(key)
        if isinstance(cached, HbmExhausted):
            raise cached
        if cached is not None:
            return cached
        try:
            compiled = lowered.compile(compiler_options={"exec_time_optimization_effort": EXEC_TIME_EFFORT[effort]})
        except Exception as error:  # the compiler's own refusal: report it, never a traceback
            exhausted = _hbm_exhausted(str(error))
            if exhausted is not None:
                _store(key, exhausted)
                raise exhausted from error
            message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise TpuAgentError(
                "tpu-compile-failed",
                f"the TPU compiler refused the program for {target.spec}: {message[:500]}",
                "run with --format json for the full program summary, or report it with the script that produced it",
            ) from error
    cost_list = compiled.cost_analysis()
    cost = cost_list[0] if isinstance(cost_list, list | tuple) else cost_list
    stats = compiled.memory_analysis()
    memory = {
        "argument": int(stats.argument_size_in_bytes),
        "output": int(stats.output_size_in_bytes),
        "alias": int(stats.alias_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
        "code": int(stats.generated_code_size_in_bytes),
    }
    numeric_cost = {key: float(value) for key, value in (cost or {}).items() if isinstance(value, int | float)}
    artifacts = CompiledArtifacts(cost=numeric_cost, memory=memory, hlo_text=compiled.as_text())
    _store(key, artifacts)
    return artifacts
