"""One forward + backward of a module on one device, with everything a comparison needs copied back to CPU.

The same function runs the whole model (the check itself) and a single submodule with recorded inputs (the
localisation replay), so both compare like with like. The backward pass needs a scalar: every floating output
is weighted by a fixed random tensor (drawn on CPU from the output's name, so both devices use the same one)
and summed. Random weights, unlike a plain sum, give every output element a different gradient, so a
permutation or broadcasting bug cannot cancel out.
"""

from __future__ import annotations

import os
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Any

from tpu_agent.check.compare import flatten_tensors
from tpu_agent.check.model import ErrorInfo

_TORCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(str(__import__("torch").__file__))))
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB_DIR = os.path.dirname(os.__file__)


def is_model_frame(filename: str) -> bool:
    """Frames of the model's own code (user or transformers), not torch, tpu-agent or the standard library."""
    path = os.path.abspath(filename)
    torch_dirs = (os.path.join(_TORCH_DIR, "torch") + os.sep, os.path.join(_TORCH_DIR, "functorch") + os.sep)
    return not (
        path.startswith(torch_dirs) or path.startswith(_OWN_DIR + os.sep) or path.startswith(_STDLIB_DIR + os.sep)
    ) and (not filename.startswith("<"))


def describe_frame(frame: traceback.FrameSummary) -> str:
    return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"


def error_info(stage: str, error: BaseException) -> ErrorInfo:
    """An :class:`ErrorInfo` for ``error``: its first lines, and the innermost frame in model code."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if is_model_frame(frame.filename)]
    message = str(error).strip() or repr(error)
    lines = message.splitlines()
    short = "\n".join(lines[:6])[:1200]
    return ErrorInfo(stage, type(error).__name__, short, describe_frame(frames[-1]) if frames else "")


def tree_to(value: Any, device: Any, requires_grad: bool = False) -> Any:
    """Copy every tensor in ``value`` (nested dicts, lists, tuples) to ``device``, detached.

    With ``requires_grad`` the floating-point copies become leaves that collect gradients, so input
    gradients are compared too.
    """
    import torch
    from torch.utils._pytree import tree_map

    def move(item: Any) -> Any:
        if not isinstance(item, torch.Tensor):
            return item
        moved = item.detach().to(device)
        if requires_grad and moved.is_floating_point():
            moved.requires_grad_(True)
        return moved

    return tree_map(move, value)


def as_invocation(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` for example inputs given as a dict (keywords), a tuple (positional) or one tensor."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def call_module(module: Any, invocation: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
    args, kwargs = invocation
    return module(*args, **kwargs)


def _loss_weight(name: str, like: Any) -> Any:
    import torch

    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(like.shape, generator=generator, dtype=torch.float32).to(like.dtype)


@dataclass
class StepResult:
    """What one forward + backward produced, on CPU: named outputs and named gradients (or the error)."""

    outputs: dict[str, Any] = field(default_factory=dict)
    gradients: dict[str, Any] = field(default_factory=dict)
    error: ErrorInfo | None = None


def run_step(
    module: Any,
    invocation: tuple[tuple[Any, ...], dict[str, Any]],
    device: Any,
    stage_prefix: str,
    parameters: dict[str, Any] | None = None,
) -> StepResult:
    """Forward ``invocation`` (args, kwargs) through ``module`` (already on ``device``), backward, and copy results to CPU.

    Gradients are taken with ``torch.autograd.grad`` (never accumulated into ``.grad``), for the parameters in
    ``parameters`` (default: the module's named parameters) and for the floating inputs. ``stage_prefix`` names
    the stages of an error: ``cpu`` or ``tpu`` (giving ``tpu-forward`` / ``tpu-backward``).
    """
    import torch

    result = StepResult()
    device_inputs = tree_to(invocation, device, requires_grad=True)
    named_parameters = dict(module.named_parameters()) if parameters is None else parameters
    trainable = {name: p for name, p in named_parameters.items() if p.requires_grad}
    args, kwargs = device_inputs
    named_inputs = {**{str(index): value for index, value in enumerate(args)}, **kwargs}
    input_leaves = {f"input.{name}": tensor for name, tensor in flatten_tensors(named_inputs) if tensor.requires_grad}
    try:
        output = call_module(module, device_inputs)
        named_outputs = dict(flatten_tensors(output))
        result.outputs = {name: tensor.detach().to("cpu") for name, tensor in named_outputs.items()}
    except Exception as error:  # the model's own failure is the finding, whatever its type
        result.error = error_info(stage_prefix if stage_prefix == "cpu" else f"{stage_prefix}-forward", error)
        return result
    differentiable = {
        name: tensor for name, tensor in named_outputs.items() if tensor.requires_grad and tensor.is_floating_point()
    }
    if not differentiable:
        return result
    try:
        loss = sum(
            (tensor * _loss_weight(name, tensor).to(tensor.device)).sum() for name, tensor in differentiable.items()
        )
        targets = {**{f"param.{name}": p for name, p in trainable.items()}, **input_leaves}
        grads = torch.autograd.grad(loss, list(targets.values()), allow_unused=True)
        result.gradients = {
            name: grad.detach().to("cpu") for name, grad in zip(targets, grads, strict=True) if grad is not None
        }
    except Exception as error:  # as above: any failure of backward is reported, not raised
        result.error = error_info(stage_prefix if stage_prefix == "cpu" else f"{stage_prefix}-backward", error)
    return result


def settle(device: Any) -> ErrorInfo | None:
    """Run the device's queued work now (``torch.accelerator.synchronize``, TorchTPU's public spelling) and
    return the error it raises, if any. Under DeferAndFuse an op nobody read back runs only at the next flush;
    settling after each step keeps its failure with the step that issued it."""
    import torch

    if str(device) == "cpu":
        return None
    try:
        torch.accelerator.synchronize()
    except Exception as error:  # the queued work's own failure is the finding
        return error_info("flush", error)
    return None


__all__ = [
    "StepResult",
    "as_invocation",
    "call_module",
    "error_info",
    "is_model_frame",
    "run_step",
    "settle",
    "tree_to",
]
