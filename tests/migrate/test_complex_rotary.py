"""TPU823's rewrite is checked by running it: the rewritten rotary embedding gives the original's values and
gradients, and its backward reaches the inputs through real ops only (no complex op, which is what crashes in
TorchTPU's backward)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from conftest import FIXTURES


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem.replace(".", "_"), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _backward_ops(loss: torch.Tensor) -> list[str]:
    """The autograd nodes between ``loss`` and the leaves, by name."""
    seen: list[str] = []
    stack = [loss.grad_fn]
    visited: set[int] = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        seen.append(type(node).__name__)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return seen


@pytest.mark.parametrize("target", ["", ".tpu"])
def test_the_rewritten_rotary_embedding_matches_the_complex_one(target: str) -> None:
    original = _load(FIXTURES / "TPU823_llama_rotary.in.py")
    rewritten = _load(FIXTURES / f"TPU823_llama_rotary{target}.out.py")
    torch.manual_seed(0)
    freqs_cis = original.precompute_freqs_cis(16, 12)
    x = torch.randn(2, 12, 64)
    results = []
    for module in (original, rewritten):
        torch.manual_seed(1)
        attention = module.Attention(64, 4)
        xq, xk = attention(x, freqs_cis)
        loss = (xq * xq.detach().roll(1, -1)).sum() + (xk**2).sum()
        loss.backward()
        results.append((xq, xk, attention.wq.weight.grad, attention.wk.weight.grad, _backward_ops(loss)))
    (*before, before_ops), (*after, after_ops) = results
    for old, new in zip(before, after, strict=True):
        torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-5)
    assert any("Complex" in op for op in before_ops)  # the original's backward goes through complex views
    assert not any("Complex" in op or "ViewAsReal" in op for op in after_ops), after_ops
