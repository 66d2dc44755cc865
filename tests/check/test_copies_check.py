"""The device runs' model copies (:class:`tpu_agent.check.copies.DeviceCopies`), on CPU and in-process: each copy
must be independent of the checked model in every code path and start from the state it had before the reference.

A copy is told apart from the original by converting it to float64 in place: a function on the copy that still
called the original's (float32) submodules fails, as it failed on the ``tpu`` device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tpu_agent.check.build import Built, build
from tpu_agent.check.copies import DeviceCopies
from tpu_agent.check.spec import parse_model_spec

FACTORIES = Path(__file__).with_name("factories.py")


def _built(name: str) -> Built:
    return build(parse_model_spec(f"{FACTORIES}:{name}"), 10**9)


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in (*model.named_parameters(), *model.named_buffers())}


def _in_float64(model: torch.nn.Module, built: Built) -> torch.Tensor:
    """``model``'s output on ``built``'s inputs, with the model converted to float64 in place."""
    model.to(torch.float64)
    args, _ = built.invocation
    return model(*(arg.double() for arg in args))


@pytest.mark.parametrize("name", ["closes_over_submodules", "builds_only_once", "returns_one_model", "good_mlp"])
def test_copies_share_nothing_with_the_model_and_each_other(name: str) -> None:
    built = _built(name)
    before = _tensors(built.model)
    copies = DeviceCopies(built)
    first, second = copies.take(), copies.take()
    held = {id(t) for t in (*built.model.parameters(), *first.parameters())}
    assert first is not built.model and not any(id(t) in held for t in second.parameters())
    expected = built.model(*built.invocation[0]).double()
    for copy in (first, second):  # a float32 reference: float32's tolerances, whatever the comparison's dtype
        torch.testing.assert_close(_in_float64(copy, built), expected, rtol=1.3e-6, atol=1e-5)
    assert all(t.dtype == torch.float32 for t in built.model.parameters())
    assert all(torch.equal(before[key], value) for key, value in _tensors(built.model).items())


def test_a_lambda_over_submodules_calls_the_copys_own_after_building_again() -> None:
    built = _built("closes_over_submodules")
    copy = DeviceCopies(built).take()
    copy.mlp.c_fc.weight.data.zero_()  # seen by the copy's own lambda only
    assert torch.equal(copy.mlpf(torch.ones(1, 8)), copy.mlp.c_proj(torch.relu(copy.mlp.c_fc.bias.expand(1, 16))))
    assert built.model.mlp.c_fc.weight.abs().sum() > 0


def test_copies_get_every_parameter_and_buffer_as_they_were_before_the_reference() -> None:
    built = _built("drawn_outside_torch")
    before = _tensors(built.model)
    copies = DeviceCopies(built)
    built.model(*built.invocation[0])  # the reference's forward advances a buffer
    assert built.model.calls.item() == 1
    for copy in (copies.take(), copies.take()):
        after = _tensors(copy)
        assert after.keys() == before.keys() and all(torch.equal(before[key], after[key]) for key in before)
