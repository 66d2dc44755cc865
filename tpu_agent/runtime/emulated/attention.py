"""Fused attention for tpu tensors: ``F.scaled_dot_product_attention`` picks a fused kernel as TorchTPU does.

PyTorch selects an SDPA kernel per device type in C++, and a Python-registered device gets only the
unfused "math" path (materialised attention matrix, several times slower). TorchTPU has its own fused
choice (reference §6.1). The emulation makes the choice the CPU would make for the same inputs (shapes,
strides, dtypes, which inputs require grad, dropout, causality, GQA) and, when that is the fused flash
kernel, calls it on the tpu tensors with the same argument preparation SDPA does (a boolean mask becomes an
additive float mask), so the numbers are the CPU's at precision "highest" in every eager mode. The MXU
rounding of q/k/v then applies as for any matmul (see ``ops.MXU_OPERANDS``).

The choice is cached per input signature: it depends only on metadata, and under DeferAndFuse the tensors
have no data yet, so it is made once on CPU stand-ins of the same layout.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tpu_agent.runtime.emulated.tensor import TpuTensor

_FLASH = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION
aten = torch.ops.aten
_choices: dict[tuple, int] = {}
_MAX_CHOICES = 4096


def _layout(t: Any) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype, t.requires_grad)


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised CPU tensor with ``t``'s layout and ``requires_grad`` (what the kernel choice reads)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).requires_grad_(t.requires_grad)


def flash_chosen(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> bool:
    """Whether the CPU's SDPA would run the fused flash kernel for inputs laid out like these."""
    signature = (
        _layout(query),
        _layout(key),
        _layout(value),
        _layout(attn_mask) if attn_mask is not None else None,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        torch.is_grad_enabled(),
    )
    choice = _choices.get(signature)
    if choice is None:
        mask = _stand_in(attn_mask) if attn_mask is not None else None
        choice = aten._fused_sdp_choice(
            _stand_in(query),
            _stand_in(key),
            _stand_in(value),
            mask,
            dropout_p,
            is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        if len(_choices) >= _MAX_CHOICES:
            _choices.clear()
        _choices[signature] = choice
    return choice == _FLASH


def _additive_mask(attn_mask: Any, dtype: torch.dtype) -> Any:
    """SDPA's boolean-mask conversion: True keeps a position (0), False removes it (-inf)."""
    if attn_mask is None or attn_mask.dtype is not torch.bool:
        return attn_mask
    return torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device).masked_fill_(
        attn_mask.logical_not(), float("-inf")
    )


def install() -> None:
    original = torch.nn.functional.scaled_dot_product_attention

    @functools.wraps(original)
    def scaled_dot_product_attention(
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        if (
            type(query) is TpuTensor
            and type(key) is TpuTensor
            and type(value) is TpuTensor
            and (attn_mask is None or type(attn_mask) is TpuTensor)
            and not torch.compiler.is_compiling()
            and flash_chosen(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        ):
            mask = _additive_mask(attn_mask, query.dtype)
            return aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, dropout_p, is_causal, attn_mask=mask, scale=scale
            )[0]
        return original(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )

    torch.nn.functional.scaled_dot_product_attention = scaled_dot_product_attention
