"""The local code changes agents receive apply cleanly to the file they name."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tpu_agent.profile import patches

SOURCE = """import torch
from torch.utils.data import DataLoader

loader = DataLoader(
    dataset,
    batch_size=32,
    num_workers=0,
)
other = DataLoader(ds, batch_size=8)
for x in loader:
    loss = model(x)
    total += loss.item()


@decorated
def step():
    pass
"""


def _apply(tmp_path: Path, diff: str) -> str:
    subprocess.run(["patch", "-p1", "--quiet"], input=diff, text=True, cwd=tmp_path, check=True)
    return (tmp_path / "train.py").read_text()


def _write(tmp_path: Path, monkeypatch) -> str:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SOURCE)
    return str(tmp_path / "train.py")


def test_kwargs_on_a_multiline_call_replace_and_add(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path, monkeypatch)
    diff = patches.add_call_kwargs(path, 4, "DataLoader", {"num_workers": "4", "drop_last": "True"})
    assert diff and diff.startswith("--- a/train.py\n+++ b/train.py\n")
    text = _apply(tmp_path, diff)
    assert "    batch_size=32,\n    num_workers=4,\n    drop_last=True,\n)\n" in text
    compile(text, "train.py", "exec")


def test_kwargs_on_a_one_line_call(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path, monkeypatch)
    text = _apply(tmp_path, patches.add_call_kwargs(path, 9, "DataLoader", {"drop_last": "True"}) or "")
    assert "other = DataLoader(ds, batch_size=8, drop_last=True)\n" in text


def test_replace_wrap_insert_and_decorate(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path, monkeypatch)
    assert patches.replace_on_line(path, 12, r"(\+=\s*.*?)\.item\(\)", r"\1.detach()")
    assert patches.replace_on_line(path, 11, r"\.item\(\)", "") is None  # the line does not look as expected
    wrapped = _apply(tmp_path, patches.wrap_line_in_with(path, 11, 'torch.autocast("tpu", dtype=torch.bfloat16)') or "")
    assert '    with torch.autocast("tpu", dtype=torch.bfloat16):\n        loss = model(x)\n' in wrapped
    compile(wrapped, "train.py", "exec")
    assert patches.wrap_line_in_with(path, 15, "x") is None  # a decorator is not a statement to wrap
    assert patches.wrap_line_in_with(path, 4, "x") is None  # nor the first line of a multi-line call
    (tmp_path / "train.py").write_text(SOURCE)
    inserted = _apply(tmp_path, patches.insert_after_torch_import(path, "torch.tpu.eager_mode = 1") or "")
    assert inserted.startswith("import torch\ntorch.tpu.eager_mode = 1\n")
    assert patches.insert_after_torch_import(path, "torch.tpu.eager_mode = 1") is None  # already there
    decorated = _apply(tmp_path, patches.add_decorator(path, 17, 'torch.compile(backend="tpu")') or "")
    assert '@torch.compile(backend="tpu")\ndef step():' in decorated
    assert patches.add_decorator(path, 1, "x") is None
