"""Fused attention for tpu tensors: ``F.scaled_dot_product_attention`` picks a fused kernel as TorchTPU does.

PyTorch selects an SDPA kernel per device type in C++, and a Python-registered device gets only the
unfused "math" path (materialised attention matrix, several times slower). TorchTPU has its own fused
choice (reference §6.1). The emulation asks the CPU which kernel it would pick for the same inputs and, when
that is the fused flash kernel, calls it on the tpu tensors directly (it has its own autograd formula); the
MXU rounding of q/k/v then applies as for any matmul (see ``ops.MXU_OPERANDS``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tpu_agent.runtime.emulated.tensor import TpuTensor

_FLASH = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION
aten = torch.ops.aten


def install() -> None:
    original = torch.nn.functional.scaled_dot_product_attention

    @functools.wraps(original)
    def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
        if (
            type(query) is TpuTensor
            and type(key) is TpuTensor
            and type(value) is TpuTensor
            and not enable_gqa
            and (attn_mask is None or type(attn_mask) is TpuTensor)
            and query._elem is not None
            and not torch.compiler.is_compiling()
        ):
            mask = attn_mask._elem if attn_mask is not None else None
            choice = aten._fused_sdp_choice(query._elem, key._elem, value._elem, mask, dropout_p, is_causal, scale=scale)
            if choice == _FLASH:
                return aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    torch.nn.functional.scaled_dot_product_attention = scaled_dot_product_attention
