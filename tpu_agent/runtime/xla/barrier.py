"""``tpu_agent::optimization_barrier``: an identity op that XLA may not look through, as ``jax.lax.optimization_barrier``.

Activation checkpointing recomputes a layer's forward in the backward from the layer's saved inputs. When the
forward and the backward are one XLA program, the recomputed ops are the same ops on the same values as the
forward's, and XLA's common-subexpression elimination merges them: the forward's activations stay live until
the backward, as without checkpointing, and the recomputation's FLOPs vanish. JAX's ``remat`` prevents this by
passing the recomputation's inputs through an optimisation barrier; this op is that barrier for captured ATen
graphs (recorded like any other op, lowered by :mod:`.extra_ops` to ``jax.lax.optimization_barrier``). On the
CPU it copies its inputs (a custom op's outputs may not alias its inputs).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import torch


@torch.library.custom_op("tpu_agent::optimization_barrier", mutates_args=())
def optimization_barrier(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors' values, which a compiler must not merge with computations on the tensors themselves."""
    return [tensor.clone() for tensor in tensors]


@optimization_barrier.register_fake
def _(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(tensor) for tensor in tensors]


OP = torch.ops.tpu_agent.optimization_barrier.default


def lowered(tensors: Sequence[jax.Array]) -> list[jax.Array]:
    """The op in JAX: XLA keeps the barrier's outputs distinct from its inputs (no CSE across it)."""
    return list(jax.lax.optimization_barrier(list(tensors)))
