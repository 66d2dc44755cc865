"""EM-3 ("nothing is compiled") on nanoGPT-shaped scripts: an existing ``if compile:`` switch is named with the
flag that turned it off, never duplicated; a new torch.compile goes where it runs on every path (never inside
``if ddp:`` or one branch of ``if init_from == ...``); the padding edit follows the same rule."""

from __future__ import annotations

import json
import py_compile
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from profile_helpers import SCRIPTS, run_cli, seed_line

from tpu_agent.profile import compile_site, sources
from tpu_agent.profile.api import diagnose
from tpu_agent.profile.model import Finding
from tpu_agent.profile.synthetic import SCRIPT_LINES, write_capture


def _profile(tmp_path: Path, script: str, *args: str) -> tuple[dict[str, Any], Path]:
    """Profile a copy of ``script`` as ``train.py`` from ``tmp_path`` (so its diffs apply there with ``patch``)."""
    train = tmp_path / "train.py"
    shutil.copy(SCRIPTS / script, train)
    result = run_cli(
        "profile", "--logdir", "prof", "--steps", "4", "--warmup", "2", "--format", "json", "train.py", *args,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.stdout.strip(), result.stderr[-3000:]
    return next(f for f in json.loads(result.stdout)["findings"] if f["rule_id"] == "EM-3"), train


def _apply(directory: Path, diff: str) -> str:
    subprocess.run(["patch", "-p1", "--quiet"], input=diff, text=True, cwd=directory, check=True)
    py_compile.compile(str(directory / "train.py"), doraise=True)
    return (directory / "train.py").read_text(encoding="utf-8")


def test_existing_compile_switch_is_named_with_the_flag_that_turned_it_off(tmp_path: Path) -> None:
    finding, train = _profile(tmp_path, "compile_switch.py", "--compile=False")
    line = seed_line(train, "compile")
    change = finding["agent_change"]
    assert change["description"].startswith(f"train.py:{line} already compiles the model (`torch.compile(model)`)")
    assert "when `compile` is true; this run set --compile=False: run with --compile=True." in change["description"]
    assert change["diff"] is None  # the source is right: this run's flag was not; no second torch.compile
    assert line in [loc["line"] for loc in finding["locations"]]


def test_without_a_switch_the_compile_goes_after_the_move_at_top_level(tmp_path: Path) -> None:
    finding, train = _profile(tmp_path, "compile_no_switch.py")
    moved = seed_line(train, "EM-3")
    diff = finding["agent_change"]["diff"]
    assert diff is not None
    text = _apply(tmp_path, diff).splitlines()
    assert text[moved - 1].startswith("model.to(device)")
    assert text[moved] == 'model = torch.compile(model, backend="tpu")'  # top level, not in `if ddp:` or a branch
    assert text.count('model = torch.compile(model, backend="tpu")') == 1


# The synthetic capture's lines: the model (class Mlp) is called at 12 and stepped at 14, at module level.
SWITCHED = """import torch

compile = False  # use torch.compile
model = Mlp()
model.to('tpu')
if compile:
    model = torch.compile(model, mode="max-autotune",
                          dynamic=True)
"""
FORWARD, STEP = SCRIPT_LINES["forward"], SCRIPT_LINES["optimizer"]


def _em3(tmp_path: Path, source: str, args: tuple[str, ...] = ()) -> Finding:
    lines = source.splitlines() + [""] * 20
    lines[FORWARD - 1], lines[STEP - 1] = "out = model(x)", "optimizer.step()"
    (tmp_path / "train.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_capture(tmp_path, steps=6, script=tmp_path / "train.py", args=args, dispatched=200)
    return next(f for f in diagnose(tmp_path).findings if f.rule_id == "EM-3")


def test_options_torchtpu_refuses_are_dropped_from_the_existing_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    change = _em3(tmp_path, SWITCHED, args=("--compile=False",)).agent_change
    assert change is not None and change.diff is not None
    assert 'passes mode="max-autotune", dynamic=True, which TorchTPU\'s backend refuses' in change.description
    assert "run with --compile=True" in change.description
    assert "    model = torch.compile(model)\n" in _apply(tmp_path, change.diff)


@pytest.mark.parametrize(
    ("options", "refused"),
    [('{"max_autotune": True, "triton.cudagraphs": False}', True), ('{"name": "step", "max_autotune": True}', False)],
)
def test_inductor_options_are_refused_and_torchtpus_own_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: str, refused: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    source = SWITCHED.replace('mode="max-autotune",\n                          dynamic=True', f"options={options}")
    change = _em3(tmp_path, source, args=("--compile=False",)).agent_change
    assert change is not None
    if refused:  # Inductor's options only: TorchTPU raises "Unexpected keyword arguments" on each key
        assert change.diff is not None and f"passes options={options}, which TorchTPU's backend refuses" in (
            change.description
        )
        assert "    model = torch.compile(model)\n" in _apply(tmp_path, change.diff)
    else:  # a dict with TorchTPU's own keys is the user's to mend: the runtime's error names the others
        assert change.diff is None and "refuses" not in change.description


def test_a_literal_switch_in_the_script_is_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    change = _em3(
        tmp_path, SWITCHED.replace(', mode="max-autotune",\n', ")\n").replace("dynamic=True)", "")
    ).agent_change
    assert change is not None and change.diff is not None
    assert "`compile = False` (train.py:3): set it to True." in change.description
    assert "compile = True  # use torch.compile\n" in _apply(tmp_path, change.diff)


def test_a_config_file_that_turns_the_switch_off_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "tiny.py").write_text("n_layer = 2\ncompile = False\n", encoding="utf-8")
    change = _em3(
        tmp_path, SWITCHED.replace("compile = False", "compile = True"), args=("config/tiny.py",)
    ).agent_change
    assert change is not None
    assert "config/tiny.py:2 sets `compile = False`: set it to True there or run with --compile=True." in (
        change.description
    )


ARGPARSED = """import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument({declaration})
args = parser.parse_args()
model = Mlp()
if {test}:
    model = torch.compile(model)
"""


@pytest.mark.parametrize(
    ("declaration", "test", "args", "expected"),
    [
        # a store_true flag that turns compile off: the fix is leaving it out, never --no-compile=False
        ('"--no-compile", action="store_true"', "not args.no_compile", ("--no-compile",),
         "when `no_compile` is false; run without --no-compile (this run passed it)."),
        ('"--compile", action=argparse.BooleanOptionalAction, default=True', "args.compile", ("--no-compile",),
         "when `compile` is true; run with --compile instead of --no-compile."),
        ('"--eager", dest="use_compile", action="store_false"', "args.use_compile", ("--eager",),
         "when `use_compile` is true; run without --eager (this run passed it)."),
        ('"--compile", action="store_true"', "args.compile", (), "when `compile` is true; run with --compile."),
    ],
)  # fmt: skip
def test_an_argparse_flag_is_named_as_the_script_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, declaration: str, test: str, args: tuple[str, ...], expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    change = _em3(tmp_path, ARGPARSED.format(declaration=declaration, test=test), args=args).agent_change
    assert change is not None and change.diff is None
    assert expected in change.description, change.description


LOOP = "for x in data:\n    model(x).backward()\n"


@pytest.mark.parametrize(
    ("source", "step_line", "expected"),
    [
        # nanoGPT's three ways to build the model, no else: the chain is the construction, `.to` the last move
        (
            "if init_from == 'scratch':\n    model = GPT(conf)\nelif init_from == 'resume':\n    model = GPT(conf)\n"
            "    model.load_state_dict(sd)\nelif init_from.startswith('gpt2'):\n    model = GPT.from_pretrained(init_from)\n"
            "if block_size < model.config.block_size:\n    model.crop_block_size(block_size)\nmodel.to(device)\n"
            "if ddp:\n    model = DDP(model)\n" + LOOP,
            14,
            10,
        ),
        # inside main(): the unconditional rebind is the last anchor; `if ddp:` is not
        (
            "def main():\n    model = GPT(conf)\n    model = model.to(device)\n    if ddp:\n        model = DDP(model)\n"
            "    for x in data:\n        model(x).backward()\n",
            7,
            3,
        ),
        # built at module level, stepped in train(): before the call that hands the model over
        (
            "def train(model):\n    for x in data:\n        model(x).backward()\n\n\n"
            "model = GPT(conf)\nmodel.to(device)\ntrain(model)\nmodel.eval()\n",
            3,
            7,
        ),
    ],
)
def test_inserted_compile_follows_the_last_rebind_on_every_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, step_line: int, expected: int
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(source, encoding="utf-8")
    path = str(tmp_path / "train.py")  # absolute: the parsed source is cached by path
    diff = compile_site.wrap_model_after_construction(path, "GPT", step_line, "torch.compile({var})")
    assert diff is not None
    before = source.splitlines()
    after = _apply(tmp_path, diff).splitlines()
    indent = before[expected - 1][: len(before[expected - 1]) - len(before[expected - 1].lstrip())]
    assert after[:expected] == before[:expected] and after[expected] == f"{indent}model = torch.compile(model)"
    assert after[expected + 1 :] == before[expected:]


def test_padding_created_in_a_branch_runs_on_every_path(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(
        "def train(model, loader, crop):\n    for x in loader:\n        if crop:\n            x = x[:, :30]\n"
        "        out = model(x)\n",
        encoding="utf-8",
    )
    origin = sources.origin_of_call_inputs(str(path), 5)
    assert origin is not None and origin.line == 4
    diff = sources.padding_diff(str(path), origin, dim=1, sizes=[30, 50], rank=2)
    assert diff is not None and "\n+        x = torch.nn.functional.pad(x, (0, -x.shape[1] % 64))" in diff
