"""``torch_tpu._internal.sync``: materialise and wait for tpu tensors (``sync.synchronize(tensors, wait=True)``)."""

from __future__ import annotations

from .sync import computation_mlir, is_materialized, synchronize

__all__ = ["computation_mlir", "is_materialized", "synchronize", "sync"]
