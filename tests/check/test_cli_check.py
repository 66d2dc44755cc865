"""``tpu-agent check`` end to end: real models, real worker processes, the emulated ``tpu`` device.

Worker processes import torch (seconds each on a loaded machine; transformers doubles that), so the Hugging Face
type, directory and factory checks share one serving worker (the sweep's layout: one process, one model after
another, modes switched in-process), checked once in a module fixture; the CLI runs in a fresh process only where
that is the point (JSON and --output with a fresh process per mode, the text table), on factories, whose
workers need no transformers, and :func:`check_model` where a timeout is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpu_agent.check import CheckOptions, check_model, parse_model_spec
from tpu_agent.check.pool import ServingWorker
from tpu_agent.errors import TpuAgentError

ROOT = Path(__file__).resolve().parents[2]
FACTORIES = Path(__file__).with_name("factories.py")

pytestmark = pytest.mark.slow

# factory name -> modes it is checked in (None: all three); in this order, so that the worker restarted after
# `crashes` needs no transformers
SERVED_FACTORIES: dict[str, tuple[str, ...] | None] = {
    "good_mlp": None,
    "keyword_inputs": ("strict",),
    "keeps_state": ("strict",),
    "wrong_forward": ("strict", "defer-and-fuse"),
    "wrong_backward": ("strict",),
    "closes_over_submodules": None,
    "drawn_outside_torch": None,
    "builds_only_once": ("strict", "defer-and-fuse"),
    "returns_one_model": ("strict", "defer-and-fuse"),
    "plain_tensor_attribute": ("strict", "defer-and-fuse"),
    "raises": ("strict", "compile"),
    "not_a_pair": ("strict",),
    "missing_function": ("strict",),
    "crashes": ("strict", "defer-and-fuse"),
    "good_mlp_after_crash": ("strict",),
}


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "tpu_agent", "check", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(FACTORIES.read_text().splitlines(), 1) if text in line)


def _tiny_vit_directory(path: Path, weights: bool) -> Path:
    from transformers import AutoConfig, ViTForImageClassification

    from tpu_agent.check.tiny import shrink_config

    config = shrink_config(AutoConfig.for_model("vit"))
    if weights:
        ViTForImageClassification(config).save_pretrained(path)
    else:
        config.save_pretrained(path)
    return path


def _serve(root: Path) -> dict[str, dict[str, Any]]:
    """A Hugging Face type, two model directories and every factory above, checked one after another by one
    serving worker: each name's report, or the usage error that refused it (as dictionaries)."""
    specs: dict[str, str] = {"vit": "vit"}
    modes: dict[str, tuple[str, ...] | None] = {"vit": None}
    for weights in (True, False):
        name = "dir-with-weights" if weights else "dir-config-only"
        specs[name], modes[name] = str(_tiny_vit_directory(root / name, weights)), ("strict",)
    specs |= {name: f"{FACTORIES}:{name.removesuffix('_after_crash')}" for name in SERVED_FACTORIES}
    modes |= SERVED_FACTORIES
    results: dict[str, dict[str, Any]] = {}
    with ServingWorker(CheckOptions(), "emulated") as worker:
        for name, spec in specs.items():
            try:
                results[name] = {"report": worker.check(parse_model_spec(spec), modes[name]).to_dict()}
            except TpuAgentError as error:  # usage problems found while building
                results[name] = {"error": error.to_dict()}
    return results


@pytest.fixture(scope="module")
def served(run_once: Callable[..., Any]) -> dict[str, dict[str, Any] | TpuAgentError]:
    """Each served name's report (a dictionary) or usage error."""
    return {
        name: TpuAgentError(**result["error"]) if "error" in result else result["report"]
        for name, result in run_once("check-served", _serve).items()
    }


def _report(served: dict[str, dict[str, Any] | TpuAgentError], name: str) -> dict[str, Any]:
    result = served[name]
    assert not isinstance(result, TpuAgentError), result
    return result


@pytest.mark.long  # the first test of the shared serving worker (its fixture: about half a minute)
def test_hf_model_type_passes_in_every_mode(served: dict[str, Any]) -> None:
    report = _report(served, "vit")
    assert report["status"] == "pass" and report["model"]["name"] == "ViTForImageClassification"
    assert report["model"]["kind"] == "hf-type" and report["model"]["task"] == "image-classification"
    assert [m["mode"] for m in report["modes"]] == ["strict", "defer-and-fuse", "compile"]
    for mode in report["modes"]:
        assert mode["status"] == "pass" and mode["outputs_checked"] >= 1 and mode["gradients_checked"] > 10, mode


def test_cli_checks_each_mode_in_its_own_process_and_writes_the_json_report(tmp_path: Path) -> None:
    result = run_cli(f"{FACTORIES}:good_mlp", "--format", "json", "--output", str(tmp_path / "check.json"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == json.loads((tmp_path / "check.json").read_text())
    assert report["status"] == "pass" and report["model"]["name"] == "Sequential"
    assert [m["mode"] for m in report["modes"]] == ["strict", "defer-and-fuse", "compile"]
    for mode in report["modes"]:
        assert mode["status"] == "pass" and mode["outputs_checked"] == 1 and mode["gradients_checked"] == 5, mode
    assert report["tolerances"]["float32"] == {"rtol": 1e-5, "atol": 1e-6}


def test_factory_passes_in_every_mode_in_one_process(served: dict[str, Any]) -> None:
    report = _report(served, "good_mlp")
    assert report["status"] == "pass", report
    assert [m["mode"] for m in report["modes"]] == ["strict", "defer-and-fuse", "compile"]
    assert report["model"]["kind"] == "factory" and report["model"]["name"] == "Sequential"


@pytest.mark.parametrize("weights", [True, False], ids=["with-weights", "config-only"])
def test_local_model_directory(served: dict[str, Any], weights: bool) -> None:
    report = _report(served, "dir-with-weights" if weights else "dir-config-only")
    assert report["status"] == "pass", report
    assert report["model"]["kind"] == "directory" and report["model"]["parameters"] > 0
    expected = "weights from model.safetensors" if weights else "random init (no weights in the directory)"
    assert report["model"]["weights"] == expected


def test_keyword_inputs_and_integer_outputs(served: dict[str, Any]) -> None:
    report = _report(served, "keyword_inputs")
    assert report["status"] == "pass", report
    mode = report["modes"][0]
    assert mode["outputs_checked"] == 2 and mode["gradients_checked"] == 4  # weight, bias, x, scale


def test_a_model_that_keeps_a_non_leaf_tensor_from_its_forward(served: dict[str, Any]) -> None:
    assert _report(served, "keeps_state")["status"] == "pass"  # copied for the device before the reference ran


def test_forward_bug_is_localised_to_its_layer_and_op(served: dict[str, Any]) -> None:
    report = _report(served, "wrong_forward")
    assert report["status"] == "mismatch" and [m["mode"] for m in report["modes"]] == ["strict", "defer-and-fuse"]
    for mode in report["modes"]:
        where = mode["localisation"]
        assert mode["status"] == "mismatch" and mode["mismatches"][0]["name"] == "output"
        assert (where["module"], where["module_type"], where["kind"]) == ("1", "Scaled", "forward"), where
        assert where["op"] == "aten::mul.Tensor"
        assert where["op_location"] == f"factories.py:{line_of('y = y * 1.01')} in forward"


def test_backward_only_bug_is_localised(served: dict[str, Any]) -> None:
    [mode] = _report(served, "wrong_backward")["modes"]
    where = mode["localisation"]
    assert mode["status"] == "mismatch" and (where["module"], where["module_type"], where["kind"]) == (
        "2",
        "BadGradient",
        "backward",
    )
    assert where["op_location"] == f"factories.py:{line_of('return grad * 1.5')} in backward"


def test_functions_kept_on_modules_call_the_device_copys_own_submodules(served: dict[str, Any]) -> None:
    """Regression (minGPT's ``Block``): a lambda closing over submodules, a bound method and a partial of one;
    a deep copy's lambda called the CPU model's submodules and every mode failed with tensors on two devices."""
    report = _report(served, "closes_over_submodules")
    assert [(m["mode"], m["status"]) for m in report["modes"]] == [
        ("strict", "pass"),
        ("defer-and-fuse", "pass"),
        ("compile", "pass"),
    ], report
    assert all(m["gradients_checked"] == 9 for m in report["modes"])  # 8 parameters and the input


def test_state_that_building_again_does_not_reproduce_is_copied_as_it_was_before_the_reference(
    served: dict[str, Any],
) -> None:
    report = _report(served, "drawn_outside_torch")
    assert [m["status"] for m in report["modes"]] == ["pass", "pass", "pass"], report


@pytest.mark.parametrize("name", ["builds_only_once", "returns_one_model"])
def test_a_model_that_cannot_be_built_again_is_checked_on_deep_copies(served: dict[str, Any], name: str) -> None:
    report = _report(served, name)
    assert [m["status"] for m in report["modes"]] == ["pass", "pass"], report


def test_an_error_is_localised_to_the_op_that_raises_it_in_defer_and_fuse_too(served: dict[str, Any]) -> None:
    report = _report(served, "plain_tensor_attribute")
    assert [m["mode"] for m in report["modes"]] == ["strict", "defer-and-fuse"]
    for mode in report["modes"]:
        where = mode["localisation"]
        assert mode["status"] == "error" and (where["module"], where["kind"]) == ("1", "error"), mode
        assert where["op"] == "aten::add.Tensor", where
        assert where["op_location"] == f"factories.py:{line_of('return x + self.offset')} in forward"
        assert "differs" not in where["note"]


def test_module_factory_in_the_text_table() -> None:
    result = run_cli("factories:wrong_backward", "--mode", "strict", cwd=FACTORIES.parent)
    assert result.returncode == 1, result.stderr
    text = " ".join(result.stdout.split())
    assert "backward diverges first in 2 (BadGradient)" in text
    assert f"factories.py:{line_of('return grad * 1.5')} in backward" in text


def test_bad_model_argument_exits_2_with_the_reason() -> None:
    # in this process (typer's runner): refused before any worker starts, so a fresh interpreter adds nothing
    from typer.testing import CliRunner

    from tpu_agent.cli import app

    result = CliRunner().invoke(app, ["check", "no_such_model_type", "--mode", "strict"])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "is not a Hugging Face model type" in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing_function", "has no function 'missing_function'"),
        ("not_a_pair", "not a (torch.nn.Module, inputs) pair"),
    ],
)
def test_bad_factories_are_usage_errors(served: dict[str, Any], name: str, message: str) -> None:
    error = served[name]
    assert isinstance(error, TpuAgentError) and error.code == "bad-factory" and message in error.message


def test_factory_that_raises_is_a_build_error_not_a_crash(served: dict[str, Any]) -> None:
    report = _report(served, "raises")
    assert report["status"] == "error"
    assert [m["error"]["stage"] for m in report["modes"]] == ["build", "build"]
    assert report["modes"][0]["error"]["message"] == "factory failed on purpose"


def test_a_worker_that_dies_is_the_verdict_and_the_next_model_gets_a_fresh_one(served: dict[str, Any]) -> None:
    report = _report(served, "crashes")
    assert [(m["mode"], m["error"]["type"]) for m in report["modes"]] == [
        ("strict", "WorkerDied"),
        ("defer-and-fuse", "WorkerDied"),
    ]
    assert "exited with code" in report["modes"][0]["error"]["message"]
    assert _report(served, "good_mlp_after_crash")["status"] == "pass"


def test_a_mode_past_its_timeout_is_an_error() -> None:
    report = check_model(f"{FACTORIES}:good_mlp", CheckOptions(modes=("strict",), timeout_s=0.5))
    assert report.modes[0].error is not None and report.modes[0].error.stage == "timeout"
    assert report.exit_code == 1


@pytest.mark.long  # a worker importing transformers and XLA-compiling RWKV's step: about half a minute
def test_a_recurrent_state_gradient_reaches_the_xla_compiled_backward() -> None:
    """RWKV (a recurrent state carried between chunks) compiles through XLA forward and backward and matches the
    CPU. The coercion its backward once needed (``TpuTensor.__coerce_same_metadata_as_tangent__``) no longer decides
    this run in torch 2.13; tests/runtime/test_emulated.py checks the coercion itself. Both modes in one worker
    (a process per mode is what the JSON test above checks): one import of transformers and torch, not two."""
    from tpu_agent.runtime.xla import settings

    if settings.missing_xla_packages():
        pytest.skip(f"the XLA compiler needs {settings.missing_xla_packages()}")
    options = CheckOptions(modes=("strict", "compile"), process_per_mode=False, env={"TPU_AGENT_COMPILER": "xla"})
    report = check_model("rwkv", options)
    strict, compiled = report.modes
    assert compiled.status == "pass", compiled.error
    # judged under XLA's tolerance, which the report states; Strict runs CPU kernels op by op, under the tight one
    assert compiled.through_xla and not strict.through_xla
    assert report.to_dict()["xla_tolerances"]["float32"] == {"rtol": 1e-4, "atol": 1e-5}
