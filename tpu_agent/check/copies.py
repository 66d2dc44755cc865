"""The models the device runs use: each an independent copy of the checked model, as it was before the CPU
reference ran, whose every code path uses its own parameters.

``copy.deepcopy`` does not give that: it copies a function as the function itself, so a lambda kept on a module
and closing over its submodules (minGPT's ``Block``: ``m = self.mlp; self.mlpf = lambda x: m.c_proj(m.c_fc(x))``)
still calls the original CPU submodules from the copy, and the device run fails with tensors on two devices
although the model runs on ``tpu`` when moved in place. So a copy is the model built again the way it was built
(:attr:`Built.rebuild`: the factory called again, the class constructed from the same config), which gives it
its own lambdas, bound methods and partials, then given the original's parameters and buffers (non-persistent
ones too, which ``state_dict`` leaves out), so the weights are identical whatever the construction drew.

A model that cannot be built again into the same layout (a factory that fails on a second call, builds another
structure, or returns the same object) falls back to deep copies, as before.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tpu_agent.check.build import Built


def _distinct_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """Each parameter and buffer once (a tied parameter under its first name)."""
    yield from model.named_parameters()
    yield from model.named_buffers()


def _layout(model: Any) -> list[tuple[Any, ...]]:
    """What a model must share with another for the other's tensors to be loaded into it: every name a parameter
    or buffer is reachable by, with its shape, dtype and whether it trains, and which names are distinct (so the
    same parameters are tied)."""
    every = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    distinct = {name for name, _ in _distinct_tensors(model)}
    return [(name, tuple(tensor.shape), tensor.dtype, tensor.requires_grad, name in distinct) for name, tensor in every]


@dataclass
class Snapshot:
    """A model's parameters and buffers (copied) and their layout."""

    layout: list[tuple[Any, ...]]
    tensors: dict[str, Any]

    @classmethod
    def of(cls, model: Any) -> Snapshot:
        return cls(_layout(model), {name: tensor.detach().clone() for name, tensor in _distinct_tensors(model)})

    def load_into(self, model: Any) -> None:
        """Copy the snapshot's values into ``model``, which must have the same layout (else ``ValueError``)."""
        import torch

        layout = _layout(model)
        if layout != self.layout:
            differing = next((pair for pair in zip(layout, self.layout, strict=False) if pair[0] != pair[1]), None)
            where = f"{differing[0]} instead of {differing[1]}" if differing else f"{len(layout)} tensors"
            raise ValueError(f"built again, the model has another layout: {where}")
        with torch.no_grad():
            for name, tensor in _distinct_tensors(model):
                tensor.copy_(self.tensors[name])


def _shares_state(one: Any, other: Any) -> bool:
    """Whether two models hold a submodule or a parameter in common (moving one would move it in the other)."""
    held = {id(item) for item in (*one.modules(), *one.parameters())}
    return any(id(item) in held for item in (*other.modules(), *other.parameters()))


class DeviceCopies:
    """Independent CPU copies of ``built.model`` as it is when this is made, one per :meth:`take`.

    Make it before the CPU reference runs: a forward may change the model (a buffer updated, a state kept), and
    every device run must start where the reference started."""

    def __init__(self, built: Built) -> None:
        self._built = built
        self._snapshot: Snapshot | None = None
        self._ready: Any = None  # the first copy, built at once to learn whether building again works
        self._pristine: Any = None  # the deep-copy fallback's source
        try:
            self._snapshot = Snapshot.of(built.model)
            self._ready = self._rebuilt(self._snapshot)
        except Exception as error:  # building again does not give the same model: deep copies, as they come
            self._snapshot = None
            print(
                f"check: building the model again failed ({type(error).__name__}: {error}); the device runs use "
                "deep copies, in which a function kept on a module still calls the original's submodules",
                file=sys.stderr,
            )
            try:
                self._pristine = copy.deepcopy(built.model)
            except Exception:  # a model that cannot be copied at all: each copy is taken from the model as it is then
                self._pristine = None

    def _rebuilt(self, snapshot: Snapshot) -> Any:
        model = self._built.rebuild()
        if _shares_state(model, self._built.model):
            raise ValueError("built again, the model shares submodules or parameters with the first one")
        snapshot.load_into(model)
        return model

    def take(self) -> Any:
        """A copy of the model that nothing else holds, on CPU."""
        if self._ready is not None:
            model, self._ready = self._ready, None
            return model
        if self._snapshot is not None:
            return self._rebuilt(self._snapshot)
        return copy.deepcopy(self._built.model if self._pristine is None else self._pristine)


__all__ = ["DeviceCopies", "Snapshot"]
