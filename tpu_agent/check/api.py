"""``check_model``: the library call behind ``tpu-agent check``, its MCP tool and the coverage benchmark.

Each mode runs in its own worker process by default, configured the way ``tpu-agent run`` configures a rank
(backend and TorchTPU's eager-mode variables in the environment, read once at activation), so one mode's
crash, hang or leaked state never hides another's verdict. A worker that dies or runs past ``timeout_s`` is
itself the verdict for its modes (an ``error`` with stage ``worker`` or ``timeout``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tpu_agent
from tpu_agent.check.model import (
    ERROR,
    MODES,
    CheckReport,
    ErrorInfo,
    ModelInfo,
    ModeResult,
    eager_mode_of,
)
from tpu_agent.check.spec import ModelSpec, parse_model_spec
from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.envvars import BACKEND_ENV, CHIP_ENV, apply_env
from tpu_agent.runtime.xla import settings
from tpu_agent.runtime.xla.settings import COMPILER_ENV

# Defaults and limits that `tpu-agent check` (cli/check.py) takes from here, so the CLI and the library agree.
DEFAULT_MAX_PARAMETERS = 1_000_000_000  # a model directory describing more is refused (4 GB of float32 weights)
DEFAULT_TIMEOUT_S = 600.0  # per mode: a worker past it is killed and its modes are errors (stage "timeout")
MIN_TIMEOUT_S = 1.0
STDERR_TAIL = 2000


@dataclass
class CheckOptions:
    """How to check: which modes, on which backend, with what limits.

    ``process_per_mode`` (the default) gives each mode a fresh process; ``False`` runs all modes in one
    process, switching the eager mode through ``torch.tpu.eager_mode`` (cheaper, used by large sweeps).
    ``measure_steps`` > 0 also times that many repeated forward + backward steps on CPU and on tpu.
    """

    modes: tuple[str, ...] = tuple(MODES)
    backend: str = "auto"
    chip: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_parameters: int = DEFAULT_MAX_PARAMETERS
    localise: bool = True
    localise_errors: bool = True  # False: errors keep only the source line that raised (saves time in sweeps)
    measure_steps: int = 0
    process_per_mode: bool = True
    matmul_precision: str = "highest"
    compiler: str | None = None  # the emulation's graph compiler (xla or eager); None: the environment's or default
    env: dict[str, str] = field(default_factory=dict)
    max_memory_mb: int | None = None  # a worker allocating more fails with an error instead of exhausting the host


def _validate(options: CheckOptions) -> None:
    unknown = [mode for mode in options.modes if mode not in MODES]
    if unknown or not options.modes:
        raise TpuAgentError(
            "unknown-mode",
            f"unknown check mode(s) {', '.join(unknown) or '(none given)'} (--mode)",
            f"use any of: {', '.join(MODES)}",
        )
    if options.matmul_precision not in ("highest", "high", "medium"):
        raise TpuAgentError(
            "bad-precision", f"unknown matmul precision {options.matmul_precision!r}", "use highest, high or medium"
        )


def worker_env(options: CheckOptions, backend: str, mode: str) -> dict[str, str]:
    package_root = str(Path(tpu_agent.__file__).resolve().parent.parent)
    env = apply_env(eager_mode_of(mode).env_updates())
    env.update(options.env)
    env[BACKEND_ENV] = backend
    if options.compiler is not None:
        env[COMPILER_ENV] = options.compiler
    if options.chip:
        env[CHIP_ENV] = options.chip
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
    return env


def _failed(modes: list[str], stage: str, kind: str, message: str) -> list[ModeResult]:
    return [ModeResult(mode, ERROR, error=ErrorInfo(stage, kind, message)) for mode in modes]


def timed_out(modes: list[str], timeout_s: float) -> list[ModeResult]:
    """The verdict for modes whose worker ran past the timeout (and was killed)."""
    return _failed(modes, "timeout", "Timeout", f"no result within {timeout_s:g} s (--timeout)")


def died(modes: list[str], returncode: int | None, stderr: str) -> list[ModeResult]:
    """The verdict for modes whose worker died without a result (a crash in native code, an abort)."""
    tail = stderr[-STDERR_TAIL:].strip()
    return _failed(modes, "worker", "WorkerDied", f"the worker exited with code {returncode}: {tail}")


def worker_request(spec: ModelSpec, modes: list[str], options: CheckOptions) -> dict[str, Any]:
    """The JSON request a worker answers (one process per request, or many in a serving worker)."""
    return {
        "spec": spec.to_dict(),
        "modes": modes,
        "max_parameters": options.max_parameters,
        "localise": options.localise,
        "localise_errors": options.localise_errors,
        "measure_steps": options.measure_steps,
        "matmul_precision": options.matmul_precision,
    }


def read_worker_result(result: dict[str, Any]) -> tuple[ModelInfo | None, list[ModeResult]]:
    """A worker's JSON result as records; a usage problem it found (bad factory, oversized model) is raised."""
    if "usage_error" in result:
        raise TpuAgentError(**result["usage_error"])
    model = ModelInfo(**result["model"]) if result.get("model") else None
    return model, [ModeResult.from_dict(item) for item in result["modes"]]


def memory_limit(max_memory_mb: int | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` capping the worker's data segment (heap and anonymous mappings, where tensors live) at
    ``max_memory_mb``: a model too large for it fails with an allocation error, reported like any other, instead
    of pushing the machine into its OOM killer (sweeps run many models side by side)."""
    if not max_memory_mb:
        return None
    limit = max_memory_mb * 1024 * 1024

    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    return apply


def _run_worker(
    spec: ModelSpec, modes: list[str], options: CheckOptions, backend: str
) -> tuple[ModelInfo | None, list[ModeResult]]:
    with tempfile.TemporaryDirectory(prefix="tpu-agent-check-") as scratch:
        request_path, result_path = Path(scratch) / "request.json", Path(scratch) / "result.json"
        request_path.write_text(json.dumps(worker_request(spec, modes, options)), encoding="utf-8")
        process = subprocess.Popen(
            [sys.executable, "-m", "tpu_agent.check.worker", str(request_path), str(result_path)],
            env=worker_env(options, backend, modes[0]),
            preexec_fn=memory_limit(options.max_memory_mb),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            _, stderr = process.communicate(timeout=options.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return None, timed_out(modes, options.timeout_s)
        if not result_path.is_file():
            return None, died(modes, process.returncode, stderr.decode("utf-8", "replace"))
        result = json.loads(result_path.read_text(encoding="utf-8"))
    return read_worker_result(result)


def check_model(
    spec: ModelSpec | str,
    options: CheckOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> CheckReport:
    """Build ``spec`` on CPU, run forward + backward on CPU and on the ``tpu`` device in each mode, compare.

    ``spec`` is a :class:`ModelSpec` or a MODEL string (a Hugging Face model type, a model directory or
    ``module:factory``). Raises :class:`TpuAgentError` for bad input (unknown type, missing directory, bad
    factory, oversized model); every finding about the model itself is in the returned report.
    """
    from tpu_agent.runtime.select import select_backend

    options = options or CheckOptions()
    _validate(options)
    model_spec = parse_model_spec(spec) if isinstance(spec, str) else spec
    backend = select_backend(options.backend).name
    compiler = _compiler(options, backend)  # an unknown or unavailable compiler is refused before any worker starts
    groups = [[mode] for mode in options.modes] if options.process_per_mode else [list(options.modes)]
    model: ModelInfo | None = None
    results: list[ModeResult] = []
    for index, group in enumerate(groups):
        if progress is not None:
            progress(f"checking {model_spec.target} in {', '.join(group)}...")
        built, group_results = _run_worker(model_spec, group, options, backend)
        model = model or built
        results.extend(group_results)
        if group_results and all(r.error is not None and r.error.on_reference for r in group_results):
            # the model does not build or run on CPU: the remaining modes would only repeat that
            results.extend(
                ModeResult(mode, ERROR, error=group_results[0].error) for rest in groups[index + 1 :] for mode in rest
            )
            break
    info = model or ModelInfo(spec=model_spec.target, kind=model_spec.kind, task=model_spec.task or "")
    return CheckReport(info, results, backend=backend, matmul_precision=options.matmul_precision, compiler=compiler)


def _compiler(options: CheckOptions, backend: str) -> str | None:
    """The graph compiler the workers ran (``None`` on real torch_tpu, which compiles with XLA itself): the one
    asked for, else the environment's, else the default, resolved as the workers resolve it."""
    if backend != "emulated":
        return None
    chosen = options.compiler or options.env.get(COMPILER_ENV) or os.environ.get(COMPILER_ENV)
    return settings.resolve(chosen)


__all__ = ["DEFAULT_MAX_PARAMETERS", "DEFAULT_TIMEOUT_S", "MIN_TIMEOUT_S", "CheckOptions", "check_model"]
