"""PR-1's fix changes the autocast the forward already runs under (nanoGPT's ``with ctx:``) instead of nesting a
second ``torch.autocast`` inside it; without one, it wraps the forward in a new one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tpu_agent.profile.amp_context import enclosing_autocast
from tpu_agent.profile.api import diagnose
from tpu_agent.profile.flags import command_line_value
from tpu_agent.profile.model import Finding
from tpu_agent.profile.synthetic import SCRIPT_LINES, write_capture

# nanoGPT's train.py, cut down: the dtype setting, the autocast context it builds, the forward under `with ctx:`.
NANOGPT = """import torch
from contextlib import nullcontext

dtype = 'bfloat16' if torch.cuda.is_available() else 'float16'  # 'float32', 'bfloat16', or 'float16'
device_type = 'tpu'
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)


def estimate_loss(model, X, Y):
    with ctx:
        logits, loss = model(X, Y)
    return loss.item()
"""
FORWARD = SCRIPT_LINES["forward"]
CTX_LINE, DTYPE_LINE, WITH_LINE = 7, 4, 11


def _pr1(tmp_path: Path, source: str, args: tuple[str, ...] = ()) -> tuple[Finding, Path]:
    script = tmp_path / "train.py"
    script.write_text(source + "\n" * 10, encoding="utf-8")  # the synthetic capture names lines up to 16
    assert source.splitlines()[FORWARD - 1].strip() == "logits, loss = model(X, Y)"
    write_capture(tmp_path, steps=6, script=script, args=args)
    return next(f for f in diagnose(tmp_path).findings if f.rule_id == "PR-1"), script


def _applied(tmp_path: Path, diff: str) -> str:
    subprocess.run(["patch", "-p1", "--quiet"], input=diff, text=True, cwd=tmp_path, check=True)
    text = (tmp_path / "train.py").read_text(encoding="utf-8")
    compile(text, "train.py", "exec")
    return text


def test_nanogpt_ctx_with_a_dtype_override_says_which_flag_to_pass(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    finding, script = _pr1(tmp_path, NANOGPT, args=("config/tiny.py", "--max_iters=3", "--dtype=float32"))
    change = finding.agent_change
    assert change is not None and change.diff is None  # the source is right; this run's flag was not
    assert "run with --dtype=bfloat16" in change.description and "--dtype=float32" in change.description
    assert f"train.py:{CTX_LINE}" in change.description and f"train.py:{DTYPE_LINE}" in change.description
    assert "torch.autocast(" not in finding.suggestion  # no second autocast nested inside `ctx`
    lines = [(loc.file, loc.line) for loc in finding.locations]
    assert lines[:3] == [(str(script), FORWARD), (str(script), CTX_LINE), (str(script), DTYPE_LINE)]


def test_nanogpt_ctx_without_an_override_points_at_the_setting_and_its_nullcontext(tmp_path: Path) -> None:
    finding, _ = _pr1(tmp_path, NANOGPT)
    assert finding.agent_change is not None and finding.agent_change.diff is None
    description = finding.agent_change.description
    assert "`dtype`" in description and "--dtype=bfloat16" in description
    assert "nullcontext() when `device_type == 'cpu'`" in description


@pytest.mark.parametrize(
    ("before", "after", "edited_line"),
    [
        # a literal setting: set it to bfloat16
        (
            "dtype = 'bfloat16' if torch.cuda.is_available() else 'float16'",
            "dtype = 'float32'",
            "\ndtype = 'bfloat16'  # 'float32'",
        ),
        # a literal dtype in the autocast call itself
        (
            "ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)",
            'ctx = torch.autocast("tpu", dtype=torch.float16)',
            'ctx = torch.autocast("tpu", dtype=torch.bfloat16)',
        ),
        # no dtype: the device's default
        (
            "ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)",
            "ctx = torch.amp.autocast(device_type=device_type)",
            "ctx = torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)",
        ),
        # the autocast written in the `with` itself
        (
            "    with ctx:",
            '    with torch.autocast(device_type="tpu", dtype=torch.float32):',
            '    with torch.autocast(device_type="tpu", dtype=torch.bfloat16):',
        ),
    ],
)
def test_the_diff_edits_the_existing_autocast(
    tmp_path: Path,
    monkeypatch,  # type: ignore[no-untyped-def]
    before: str,
    after: str,
    edited_line: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    source = NANOGPT.replace(before, after)
    assert source != NANOGPT
    finding, _ = _pr1(tmp_path, source)
    assert finding.agent_change is not None and finding.agent_change.diff, finding.agent_change
    text = _applied(tmp_path, finding.agent_change.diff)
    assert edited_line in text
    assert text.count("autocast(") == source.count("autocast(")  # changed in place, none added


def test_a_forward_under_no_autocast_is_wrapped_in_one(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    finding, _ = _pr1(tmp_path, NANOGPT.replace("    with ctx:", "    if model:"))
    assert finding.agent_change is not None and finding.agent_change.diff
    text = _applied(tmp_path, finding.agent_change.diff)
    assert '    if model:\n        with torch.autocast("tpu", dtype=torch.bfloat16):\n' in text


def test_a_bf16_context_that_ran_its_nullcontext_branch_says_so(tmp_path: Path) -> None:
    source = NANOGPT.replace("dtype = 'bfloat16' if torch.cuda.is_available() else 'float16'", "dtype = 'bfloat16'")
    finding, _ = _pr1(tmp_path, source)
    assert finding.agent_change is not None and finding.agent_change.diff is None
    assert "nullcontext() when `device_type == 'cpu'`" in finding.agent_change.description


def test_the_context_is_found_through_names_and_nested_withs(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(NANOGPT.replace("    with ctx:", "    with torch.no_grad(), ctx:"), encoding="utf-8")
    context = enclosing_autocast(str(path), FORWARD)
    assert context is not None
    assert (context.expression, context.with_line, context.call_line) == ("ctx", WITH_LINE, CTX_LINE)
    assert (context.dtype, context.dtype_literal, context.fallback) == ("ptdtype", None, "device_type == 'cpu'")
    assert context.setting is not None and (context.setting.name, context.setting.line) == ("dtype", DTYPE_LINE)
    assert enclosing_autocast(str(path), WITH_LINE + 2) is None  # `return` is outside the `with`


def test_command_line_values() -> None:
    assert command_line_value(["config/tiny.py", "--dtype=float32", "--dtype=float16"], "dtype") == "float16"
    assert command_line_value(["--dtype", "float32"], "dtype") == "float32"
    assert command_line_value(["--dtypes=float32", "--dtype"], "dtype") is None
