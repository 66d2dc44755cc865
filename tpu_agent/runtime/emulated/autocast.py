"""``torch.autocast("tpu")`` with TorchTPU's AutocastPrivateUse1 policy (reference §6.2, repo amp_policies.cc).

The policy is data: ops cast to the autocast dtype (bf16 by default), ops cast to f32, and ``prod`` whose
accumulation dtype becomes f32. Every other op falls through uncast; TorchTPU uses no "promote" list. The
kernels sit on the AutocastPrivateUse1 dispatch key, so they cost nothing outside an autocast region.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tpu_agent.runtime.emulated.tensor import TpuTensor

LOWER_PRECISION_OPS = (
    "conv1d", "conv2d", "conv3d", "conv_tbc", "convolution", "_convolution",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "addr", "mv", "einsum", "prelu",
    "chain_matmul", "linalg_multi_dot", "linalg_vecdot",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
    "scaled_dot_product_attention", "_native_multi_head_attention", "_scaled_dot_product_flash_attention",
)  # fmt: skip

FP32_OPS = (
    "cross_entropy_loss", "nll_loss", "nll_loss2d", "nll_loss_nd", "mse_loss", "l1_loss", "smooth_l1_loss",
    "huber_loss", "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits", "margin_ranking_loss",
    "hinge_embedding_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "cosine_embedding_loss", "poisson_nll_loss", "multilabel_soft_margin_loss",
    "fft_fft", "fft_ifft", "fft_fft2", "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft", "fft_irfft",
    "fft_rfft2", "fft_irfft2", "fft_rfftn", "fft_irfftn", "fft_hfft", "fft_ihfft",
    "cholesky", "cholesky_inverse", "cholesky_solve", "linalg_cholesky", "linalg_cholesky_ex", "linalg_eig",
    "linalg_eigh", "linalg_eigvals", "linalg_eigvalsh", "linalg_inv", "linalg_inv_ex", "inverse", "linalg_svd",
    "linalg_svdvals", "svd", "linalg_qr", "geqrf", "linalg_solve", "linalg_lstsq", "linalg_det", "logdet",
    "slogdet", "linalg_slogdet", "linalg_pinv", "pinverse", "linalg_matrix_norm", "linalg_norm",
    "cdist", "quantile", "nanquantile",
    "reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
    "replication_pad3d", "avg_pool3d", "max_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d",
    "grid_sampler", "grid_sampler_2d", "grid_sampler_3d", "stft", "trace", "polar", "view_as_complex",
)  # fmt: skip

FP32_SET_OPT_DTYPE_OPS = ("prod",)

_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_libraries: list[torch.library.Library] = []


def _eligible(t: Any) -> bool:
    return type(t) is TpuTensor and t.is_floating_point() and t.dtype is not torch.float64


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if _eligible(x):
        return x if x.dtype is dtype else x.to(dtype)
    if isinstance(x, (list, tuple)) and x and isinstance(x[0], torch.Tensor):
        return type(x)(_cast(y, dtype) for y in x)
    return x


def _lower_precision(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype("tpu")
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            return op(*[_cast(a, dtype) for a in args], **{k: _cast(v, dtype) for k, v in kwargs.items()})

    return kernel


def _fp32(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            return op(
                *[_cast(a, torch.float32) for a in args], **{k: _cast(v, torch.float32) for k, v in kwargs.items()}
            )

    return kernel


def _fp32_set_opt_dtype(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            if kwargs.get("dtype") is None and any(_eligible(a) for a in args):
                kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)

    return kernel


def _register_policy(
    lib: torch.library.Library, names: tuple[str, ...], make: Callable[[Any], Callable[..., Any]]
) -> None:
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            if overload == "out" or overload.endswith("_out"):
                continue
            qualified = name if overload == "default" else f"{name}.{overload}"
            lib.impl(qualified, make(getattr(packet, overload)), "AutocastPrivateUse1")


def register() -> None:
    """Install the policy kernels, a fallthrough for every other op, and bf16 as the default autocast dtype."""
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    _register_policy(lib, LOWER_PRECISION_OPS, _lower_precision)
    _register_policy(lib, FP32_OPS, _fp32)
    _register_policy(lib, FP32_SET_OPT_DTYPE_OPS, _fp32_set_opt_dtype)
    _libraries.extend([fallback, lib])
    torch.set_autocast_dtype("tpu", torch.bfloat16)
