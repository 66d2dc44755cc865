"""The check worker: ``python -m tpu_agent.check.worker REQUEST.json RESULT.json`` (one request), or
``python -m tpu_agent.check.worker --serve`` (many, for sweeps: see :mod:`tpu_agent.check.pool`).

It builds the model on CPU, activates the runtime exactly as ``tpu-agent run`` does (the eager mode comes from
TorchTPU's own environment switches, set by the parent), runs the CPU reference (CPU tensors never enter the
emulation: its patches act on ``tpu`` tensors only), runs each requested mode, compares, and localises any
divergence. A usage problem found while building (a bad factory, an oversized model) is
returned as ``usage_error`` so that the parent can exit 2 with the same message.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tpu_agent.check.build import Built, build
from tpu_agent.check.compare import TensorDiff, compare_named, tolerances
from tpu_agent.check.copies import DeviceCopies
from tpu_agent.check.execute import StepResult, error_info, run_step, settle
from tpu_agent.check.localise import localise
from tpu_agent.check.model import ERROR, MISMATCH, PASS, ModeResult, eager_mode_of
from tpu_agent.check.spec import ModelSpec
from tpu_agent.errors import TpuAgentError
from tpu_agent.fsutil import atomic_write_text

DEVICE = "tpu"


def _worst(diffs: list[TensorDiff]) -> TensorDiff | None:
    """The diff closest to (or furthest past) its tolerance; a structural problem counts as the worst."""
    if not diffs:
        return None
    return max(
        diffs,
        key=lambda d: (
            float("inf") if d.problem else (d.max_abs_err / d.allowed if d.allowed else float(d.max_abs_err > 0))
        ),
    )


def through_xla(mode: str, backend: str) -> bool:
    """Whether XLA compiles the graphs of ``mode`` in this process: every mode on real torch_tpu (Strict compiles
    each op); on the emulation, DeferAndFuse and ``torch.compile`` under ``--compiler xla``."""
    if backend != "emulated":
        return True
    from tpu_agent.runtime.xla import settings

    if mode == "compile":
        return settings.uses_xla()
    return mode == "defer-and-fuse" and settings.deferred_uses_xla()


def _compare(mode: str, got: StepResult, ref: StepResult, xla: bool) -> ModeResult:
    if got.error is not None:
        return ModeResult(mode, ERROR, error=got.error, through_xla=xla)
    table = tolerances(xla)
    output_diffs = compare_named(got.outputs, ref.outputs, table=table)
    gradient_diffs = compare_named(got.gradients, ref.gradients, absent_is_zero=True, table=table)
    failing = [diff for diff in (*output_diffs, *gradient_diffs) if not diff.ok]
    return ModeResult(
        mode=mode,
        status=MISMATCH if failing else PASS,
        through_xla=xla,
        outputs_checked=len(output_diffs),
        gradients_checked=len(gradient_diffs),
        worst_output=_worst(output_diffs),
        worst_gradient=_worst(gradient_diffs),
        mismatches=failing[: ModeResult.MAX_LISTED],
        error=got.error,
    )


def _step_seconds(module: Any, built: Built, device: str, steps: int, parameters: dict[str, Any] | None) -> float:
    """Median wall time of ``steps`` repeated forward + backward steps (each ends by copying results to CPU)."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run_step(module, built.invocation, device, "tpu", parameters=parameters)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _set_mode(mode: str) -> None:
    """Switch the eager mode in-process through TorchTPU's public ``torch.tpu.eager_mode`` property."""
    import torch

    tpu = getattr(torch, "tpu", None)
    if tpu is not None and hasattr(tpu, "EagerMode"):
        tpu.eager_mode = tpu.EagerMode[eager_mode_of(mode).enum_name]


def run_mode(
    mode: str, built: Built, reference: StepResult, request: dict[str, Any], copies: DeviceCopies, backend: str
) -> ModeResult:
    """Run a copy of ``built`` (from ``copies``, made before the reference ran) on the tpu device in ``mode`` and
    compare with ``reference`` (under the tolerances of what ran it, ``backend``'s eager ops or XLA); localise any
    divergence."""
    import torch

    started = time.perf_counter()
    compiled = mode == "compile"

    def prepare(module: Any) -> Any:
        return torch.compile(module, backend="tpu") if compiled else module

    try:
        tpu_model = copies.take()
    except Exception as error:  # not the device's doing: the model could not be built or copied again
        return ModeResult(mode, ERROR, error=error_info("worker", error), seconds=time.perf_counter() - started)
    try:
        tpu_model.to(DEVICE)  # in place, as a user moves a model: whatever holds its submodules sees them moved
    except Exception as error:  # moving the model is the first thing the device must do right
        return ModeResult(mode, ERROR, error=error_info("tpu-forward", error), seconds=time.perf_counter() - started)
    # the weights are on the device before the first step: under DeferAndFuse their copies are deferred, and a
    # failing first graph would otherwise take them down with it
    upload_error = settle(DEVICE)
    if upload_error is not None:
        return ModeResult(mode, ERROR, error=upload_error, seconds=time.perf_counter() - started)
    parameters = dict(tpu_model.named_parameters())
    runner = prepare(tpu_model)
    got = run_step(runner, built.invocation, DEVICE, "tpu", parameters=parameters)
    xla = through_xla(mode, backend)
    result = _compare(mode, got, reference, xla)
    wanted = result.status == MISMATCH or (result.status == ERROR and request.get("localise_errors", True))
    if wanted and request.get("localise", True):
        try:
            result.localisation = localise(
                built.model, tpu_model, built.invocation, DEVICE, prepare, compiled, tolerances(xla)
            )
        except Exception as error:  # localisation is a diagnosis aid; its own failure must not hide the verdict
            result.localisation = None
            print(f"localisation failed: {type(error).__name__}: {error}", file=sys.stderr)
    steps = int(request.get("measure_steps", 0))
    if steps and result.status == PASS:
        result.cpu_step_s = _step_seconds(built.model, built, "cpu", steps, None)
        result.tpu_step_s = _step_seconds(runner, built, DEVICE, steps, parameters)
    leftover_error = settle(DEVICE)  # queued work the step never read back fails here, in this mode
    if leftover_error is not None and result.error is None:
        result.status, result.error = ERROR, leftover_error
    result.seconds = time.perf_counter() - started
    return result


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    """Everything a worker does, returning the JSON-ready result (``model``, ``modes`` or ``usage_error``)."""
    import torch

    modes: list[str] = request["modes"]
    torch.set_float32_matmul_precision(request.get("matmul_precision", "highest"))
    try:
        built = build(ModelSpec.from_dict(request["spec"]), int(request["max_parameters"]))
    except TpuAgentError as error:
        return {"usage_error": error.to_dict()}
    except Exception as error:  # the model does not build: every mode reports it
        return {
            "model": None,
            "modes": [ModeResult(mode, ERROR, error=error_info("build", error)).to_dict() for mode in modes],
        }
    from tpu_agent.runtime.api import activate

    # Activate before the CPU reference's backward: torch's autograd engine sizes its per-device queues at its
    # first backward, so a device registered after that fails every later backward on it.
    backend = activate().name
    torch.set_float32_matmul_precision(request.get("matmul_precision", "highest"))
    # Copied before the reference's forward: every mode should start from the same fresh state (and a model that
    # keeps non-leaf tensors from its forward, a recurrent state or a cache, cannot be deep-copied after one).
    copies = DeviceCopies(built)
    reference = run_step(built.model, built.invocation, "cpu", "cpu")
    if reference.error is not None:
        failed = [ModeResult(mode, ERROR, error=reference.error).to_dict() for mode in modes]
        return {"model": built.info.to_dict(), "modes": failed}
    results = []
    for mode in modes:
        try:
            if len(modes) > 1 or request.get("switch_modes"):  # one process, several modes: switch in-process
                _set_mode(mode)
            results.append(run_mode(mode, built, reference, request, copies, backend).to_dict())
        except Exception as error:  # a failure outside the model's own run: report it against this mode only
            results.append(ModeResult(mode, ERROR, error=error_info("worker", error)).to_dict())
    return {"model": built.info.to_dict(), "modes": results}


def answer(request_path: Path, result_path: Path) -> None:
    """Run the request in ``request_path`` and write its result to ``result_path`` (never raises)."""
    request = json.loads(request_path.read_text(encoding="utf-8"))
    try:
        result = run_request(request)
    except Exception as error:  # report rather than die: the parent turns this into one error per mode
        result = {
            "model": None,
            "modes": [ModeResult(m, ERROR, error=error_info("worker", error)).to_dict() for m in request["modes"]],
        }
    atomic_write_text(result_path, json.dumps(result, default=str))


def _forget_model_state() -> None:
    """Between two models in one serving process: drop Dynamo's caches (a later model must trace afresh, not
    hit a recompile limit reached by an earlier one) and collect the previous model's tensors.

    What survives the collection (modules, torch's and transformers' registries: hundreds of thousands of
    objects) is frozen out of later collections, which would otherwise walk all of it again after every model
    (a quarter of a second each, more than checking a small model) and in every full collection during one."""
    import gc

    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    gc.collect()
    gc.freeze()


def serve() -> int:
    """Answer requests until stdin closes: each stdin line is ``REQUEST.json<TAB>RESULT.json``; the answer is
    the line ``done`` on the original stdout once the result is written. The model's own prints go to stderr,
    so that nothing it writes can be taken for an answer. Imports (torch, transformers, Dynamo) are paid once
    per process instead of once per model, which is what makes a sweep of hundreds of models affordable."""
    import os

    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request_path, _, result_path = line.rstrip("\n").partition("\t")
        answer(Path(request_path), Path(result_path))
        _forget_model_state()
        answers.write("done\n")
        answers.flush()
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve()
    answer(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["answer", "main", "run_mode", "run_request", "serve"]
