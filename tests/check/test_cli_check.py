"""``tpu-agent check`` end to end: real models, real worker processes, the emulated ``tpu`` device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tpu_agent.check import CheckOptions, check_model

ROOT = Path(__file__).resolve().parents[2]
FACTORIES = Path(__file__).with_name("factories.py")

pytestmark = pytest.mark.slow


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


def check_json(*args: str, cwd: Path = ROOT) -> tuple[int, dict[str, Any]]:
    result = run_cli(*args, "--format", "json", cwd=cwd)
    return result.returncode, json.loads(result.stdout)


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(FACTORIES.read_text().splitlines(), 1) if text in line)


def test_hf_model_type_passes_in_every_mode() -> None:
    code, report = check_json("vit")
    assert code == 0, report
    assert report["status"] == "pass" and report["model"]["name"] == "ViTForImageClassification"
    assert [m["mode"] for m in report["modes"]] == ["strict", "defer-and-fuse", "compile"]
    for mode in report["modes"]:
        assert mode["status"] == "pass" and mode["outputs_checked"] >= 1 and mode["gradients_checked"] > 10, mode
    assert report["tolerances"]["float32"] == {"rtol": 1e-5, "atol": 1e-6}


def _tiny_vit_directory(path: Path, weights: bool) -> Path:
    from transformers import AutoConfig, ViTForImageClassification

    from tpu_agent.check.tiny import shrink_config

    config = shrink_config(AutoConfig.for_model("vit"))
    if weights:
        ViTForImageClassification(config).save_pretrained(path)
    else:
        config.save_pretrained(path)
    return path


@pytest.mark.parametrize("weights", [True, False], ids=["with-weights", "config-only"])
def test_local_model_directory(tmp_path: Path, weights: bool) -> None:
    directory = _tiny_vit_directory(tmp_path / "vit-tiny", weights)
    assert (directory / "model.safetensors").exists() == weights
    code, report = check_json(str(directory), "--mode", "strict")
    assert code == 0, report
    assert report["model"]["kind"] == "directory" and report["model"]["parameters"] > 0
    expected = "weights from model.safetensors" if weights else "random init (no weights in the directory)"
    assert report["model"]["weights"] == expected


def test_model_directory_over_the_size_limit_is_a_usage_error(tmp_path: Path) -> None:
    directory = _tiny_vit_directory(tmp_path / "vit", weights=False)
    result = run_cli(str(directory), "--mode", "strict", "--max-params", "1000")
    assert result.returncode == 2, result.stderr
    assert "over the 1,000 limit" in result.stderr and "config.json" in result.stderr


def test_factory_passes_in_every_mode_in_one_process_through_the_library() -> None:
    report = check_model(f"{FACTORIES}:good_mlp", CheckOptions(process_per_mode=False))
    assert report.status == "pass", report.to_dict()
    assert [m.status for m in report.modes] == ["pass"] * 3
    assert report.model.kind == "factory" and report.model.name == "Sequential"


def test_module_factory_with_keyword_inputs_and_integer_outputs() -> None:
    code, report = check_json("factories:keyword_inputs", "--mode", "strict", cwd=FACTORIES.parent)
    assert code == 0, report
    mode = report["modes"][0]
    assert mode["outputs_checked"] == 2 and mode["gradients_checked"] == 4  # weight, bias, x, scale


def test_forward_bug_is_localised_to_its_layer_and_op() -> None:
    result = run_cli(f"{FACTORIES}:wrong_forward", "--mode", "strict", "--mode", "defer-and-fuse", "--format", "json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "mismatch"
    for mode in report["modes"]:
        where = mode["localisation"]
        assert mode["status"] == "mismatch" and mode["mismatches"][0]["name"] == "output"
        assert (where["module"], where["module_type"], where["kind"]) == ("1", "Scaled", "forward"), where
        assert where["op"] == "aten::mul.Tensor"
        assert where["op_location"] == f"factories.py:{line_of('y = y * 1.01')} in forward"


def test_backward_only_bug_is_localised_in_text_output() -> None:
    result = run_cli(f"{FACTORIES}:wrong_backward", "--mode", "strict")
    assert result.returncode == 1, result.stderr
    assert "backward diverges first in 2 (BadGradient)" in " ".join(result.stdout.split())
    assert f"factories.py:{line_of('return grad * 1.5')} in backward" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("no_such_model_type", "is not a Hugging Face model type"),
        ("./no/such/dir", "does not exist"),
        (f"{FACTORIES}:missing_function", "has no function 'missing_function'"),
        (f"{FACTORIES}:not_a_pair", "not a (torch.nn.Module, inputs) pair"),
        ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
    ],
)
def test_bad_model_arguments_exit_2_with_the_reason(model: str, message: str) -> None:
    result = run_cli(model, "--mode", "strict")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in " ".join(result.stderr.split())


def test_factory_that_raises_is_a_build_error_not_a_crash() -> None:
    code, report = check_json(f"{FACTORIES}:raises", "--mode", "strict", "--mode", "compile")
    assert code == 1
    assert [m["error"]["stage"] for m in report["modes"]] == ["build", "build"]
    assert report["modes"][0]["error"]["message"] == "factory failed on purpose"


def test_a_mode_past_its_timeout_is_an_error_and_the_others_still_run() -> None:
    report = check_model(f"{FACTORIES}:good_mlp", CheckOptions(modes=("strict",), timeout_s=0.5))
    assert report.modes[0].error is not None and report.modes[0].error.stage == "timeout"
    assert report.exit_code == 1
