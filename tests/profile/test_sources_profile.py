"""Static tracing of a changing tensor back to the line that creates it, and the padding statement."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tpu_agent.profile import sources

SCRIPT = """import torch


@torch.compile(backend="tpu")
def step(model, x, *, scale=1.0):
    return model(x).sum() * scale


def train(loader, model):
    for tokens, labels in loader:
        batch = tokens.to("tpu")
        loss = step(model, x=batch)
        other = step(model, torch.randn(3, 4))
"""


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("0/0: tensor 'x' size mismatch at index 1. expected 16, actual 24", sources.ShapeGuard("x", 1, (16, 24))),
        ("tensor 'L['batch']' size mismatch at index 0. expected 8, actual 3", sources.ShapeGuard("batch", 0, (8, 3))),
        ("___check_obj_id(L['self'], 1234)", None),
    ],
)
def test_parse_guard(reason: str, expected: sources.ShapeGuard | None) -> None:
    assert sources.parse_guard(reason) == expected


def test_argument_is_followed_to_its_assignment(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT, encoding="utf-8")
    origin = sources.origin_of_argument(str(path), "step", "x")
    assert origin == sources.TensorOrigin(line=11, use_line=12, variable="batch")
    assert sources.function_at(str(path), 11) == "train" and sources.function_at(str(path), 1) == "<module>"
    assert sources.origin_of_argument(str(path), "step", "nonexistent") is None
    eager = sources.origin_of_call_inputs(str(path), 12)
    assert eager is not None and eager.line == 11 and eager.variable == "batch"


def test_loop_target_is_a_creation_line(tmp_path: Path) -> None:
    path = tmp_path / "loop.py"
    path.write_text("for tokens in loader:\n    out = model(tokens)\n", encoding="utf-8")
    origin = sources.origin_of_call_inputs(str(path), 2)
    assert origin == sources.TensorOrigin(line=1, use_line=2, variable="tokens")
    diff = sources.padding_diff(str(path), origin, dim=1, sizes=[30, 50], rank=2)
    assert diff is not None and "+    tokens = torch.nn.functional.pad(tokens, (0, -tokens.shape[1] % 64))" in diff


@pytest.mark.parametrize("rank", [None, 2, 3, 4])
@pytest.mark.parametrize("dim", [0, 1])
def test_pad_statement_pads_the_right_dim_for_any_rank(rank: int | None, dim: int) -> None:
    shape = [5, 7, 3, 2][: rank or 3]
    x = torch.zeros(shape)
    scope = {"torch": torch, "x": x}
    exec(sources.pad_statement("x", dim, 8, rank), scope)  # the statement the diff inserts, run for real
    expected = list(shape)
    expected[dim] = 8
    assert list(scope["x"].shape) == expected


def test_unreadable_or_huge_sources_are_skipped(tmp_path: Path) -> None:
    huge = tmp_path / "huge.py"
    huge.write_text("x = 1\n" * (sources.MAX_SOURCE_BYTES // 6 + 10), encoding="utf-8")
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n", encoding="utf-8")
    for path in (huge, broken, tmp_path / "missing.py", tmp_path):
        assert sources.origin_of_call_inputs(str(path), 1) is None
        assert sources.function_at(str(path), 1) == "<unknown>"


def test_bucket_for() -> None:
    assert sources.bucket_for([46, 74]) == 128 and sources.bucket_for([3, 5]) == 8 and sources.bucket_for([300]) == 128
