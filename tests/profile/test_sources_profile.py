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
    assert origin == sources.TensorOrigin(line=11, use_line=12, variable="batch", driver="tokens", driver_line=10)
    assert sources.function_at(str(path), 11) == "train" and sources.function_at(str(path), 1) == "<module>"
    assert sources.origin_of_argument(str(path), "step", "nonexistent") is None
    eager = sources.origin_of_call_inputs(str(path), 12)
    assert eager is not None and eager.line == 11 and eager.variable == "batch"


def test_loop_target_is_a_creation_line(tmp_path: Path) -> None:
    path = tmp_path / "loop.py"
    path.write_text("for tokens in loader:\n    out = model(tokens)\n", encoding="utf-8")
    origin = sources.origin_of_call_inputs(str(path), 2)
    assert origin == sources.TensorOrigin(line=1, use_line=2, variable="tokens")  # `loader` is bound nowhere here
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


# The script: a compiled lambda that calls the model, fed a tensor whose length comes from a Python value.
CHURN = """import random

import torch
import torch.nn as nn

random.seed(0)
dev = torch.device("tpu")
model = nn.Sequential(nn.Embedding(512, 128), nn.Linear(128, 128)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step_fn = torch.compile(lambda t: model(t).float().pow(2).mean(), backend="tpu")
for step in range(24):
    seq = random.randint(17, 200)
    tokens = torch.randint(0, 512, (8, seq), device=dev)
    loss = step_fn(tokens)
    loss.backward()
"""


def test_a_compiled_lambda_is_traced_to_the_tensor_its_caller_passes_and_the_value_that_sizes_it(
    tmp_path: Path,
) -> None:
    """SH-1 (the model call inside the lambda, line 10) and CO-1 (the guard on the lambda's ``t``) both name
    ``tokens`` at line 13, sized by ``seq`` (line 12): not ``model`` at line 8, which the padding diff once padded."""
    path = tmp_path / "churn.py"
    path.write_text(CHURN, encoding="utf-8")
    expected = sources.TensorOrigin(line=13, use_line=14, variable="tokens", driver="seq", driver_line=12)
    assert sources.origin_of_call_inputs(str(path), 10) == expected
    assert sources.origin_of_argument(str(path), "<lambda>", "t", 10) == expected
    locations, change = sources.shape_change(str(path), expected, 1, [27, 83, 141])
    assert [loc.line for loc in locations] == [13, 12]
    assert change.diff is not None and "+    tokens = torch.nn.functional.pad(tokens," in change.diff
    assert "model = torch.nn.functional.pad" not in change.diff and "from `seq` (line 12)" in change.description


SCALAR = """import torch


@torch.compile(backend="tpu")
def train_step(x, scale):
    return x.sum() * scale


for step in range(10):
    x = torch.randn(4, 4).to("tpu")
    loss = train_step(x, min(1.0, step / 5))
"""


def test_a_python_number_passed_to_a_compiled_function_is_found_at_its_call(tmp_path: Path) -> None:
    """CO-1 on ``scale == 0.2``: the call that passes it and a tensor argument whose device it can take."""
    path = tmp_path / "train.py"
    path.write_text(SCALAR, encoding="utf-8")
    assert sources.scalar_argument(str(path), "train_step", "scale", 5) == sources.ScalarArgument(
        11, "min(1.0, step / 5)", "x", 25
    )
    assert sources.scalar_argument(str(path), "train_step", "missing", 5) is None


def test_a_read_that_is_only_shown_runs_every_tenth_step(tmp_path: Path) -> None:
    """HS-1/HS-2: ``print(loss)`` in a counted loop gets ``if step % 10 == 0:``; an assignment keeps its read (its
    value is used later and must not go stale), and so does a loop without a counter."""
    from tpu_agent.profile.rules._sync import periodic_fix
    from tpu_agent.runtime.events import Site

    path = tmp_path / "train.py"
    path.write_text(
        "for step, batch in enumerate(loader):\n    print(loss)\n    value = loss.cpu()\n"
        "for batch in loader:\n    print(loss)\n",
        encoding="utf-8",
    )
    change = periodic_fix(Site(str(path), 2, "<module>"), ["print"])
    assert change is not None and change.diff is not None
    assert "+    if step % 10 == 0:\n+        print(loss)\n" in change.diff
    assert periodic_fix(Site(str(path), 3, "<module>"), ["cpu"]) is None
    assert periodic_fix(Site(str(path), 5, "<module>"), ["print"]) is None


def test_the_scalar_diff_replaces_the_argument_not_the_same_letters_elsewhere(tmp_path: Path) -> None:
    """CO-1 on ``s == 0.2`` in ``loss = step(x, s)``: the diff wraps the argument ``s`` (it once rewrote the ``s``
    inside ``loss``, the first match of the bare expression on the line)."""
    from tpu_agent.profile import unidiff
    from tpu_agent.profile.rules import co_recompiles
    from tpu_agent.runtime import events as ev

    path = tmp_path / "train.py"
    text = (
        "import torch\n\n\n@torch.compile\ndef step(x, s):\n    return x.sum() * s\n\n\n"
        "for i in range(10):\n    x = torch.randn(4, 4)\n    s = i / 5\n    loss = step(x, s)\n"
    )
    path.write_text(text, encoding="utf-8")
    event = ev.Compile(0, 0, 3, "step", 1, 2, True, "L['s'] == 0.2", 1, ev.Site(str(path), 12, "<module>"))
    _, change = co_recompiles._scalar_change([event])
    assert change is not None and change.diff is not None
    patched = unidiff.apply_diff(text, change.diff)
    assert "    loss = step(x, torch.tensor(s, device=x.device))\n" in patched
