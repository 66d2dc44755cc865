"""Comparing what the ``tpu`` device computed with what CPU computed: tolerances and per-tensor differences.

The tolerance is scaled by the reference tensor's magnitude (``|got - ref| <= atol + rtol * max|ref|``, per
tensor) rather than per element: gradients and logits routinely hold values that cancel to near zero, where an
elementwise relative test flags harmless last-bit differences. At ``torch.set_float32_matmul_precision
("highest")`` the emulated device computes f32 with the same kernels as CPU, so these bounds are tight; the
lower-precision dtypes get the bounds their 8- or 11-bit mantissas allow.

A mode whose graphs XLA compiled (every mode on real torch_tpu; DeferAndFuse and ``torch.compile`` under the
emulation's ``--compiler xla``) is held to :data:`XLA_TOLERANCES` instead: XLA reorders and fuses reductions and
brings its own ``exp``, ``log`` and ``tanh``, which move float32 results by 1e-5 of their scale and more on long
sums (Mamba2's ``D`` gradient) with no error in the program. That is the bound torch
itself holds a compiled graph to against eager (``torch._dynamo.utils.same``, ``tol=1e-4``); a wrong lowering
is orders of magnitude past it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Tolerance:
    """Allowed difference for one dtype: ``max|got - ref| <= atol + rtol * max|ref|``."""

    rtol: float
    atol: float


# Keyed by torch dtype name. Integer and boolean tensors must match exactly.
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(rtol=1e-10, atol=1e-12),
    "float32": Tolerance(rtol=1e-5, atol=1e-6),
    "complex64": Tolerance(rtol=1e-5, atol=1e-6),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=1e-3),
    "float16": Tolerance(rtol=2e-3, atol=1e-4),
}
# For modes XLA compiled: float32 (and complex64, its pairs) at torch's compiled-vs-eager bound; the rest as above.
XLA_TOLERANCES: dict[str, Tolerance] = {
    **TOLERANCES,
    "float32": Tolerance(rtol=1e-4, atol=1e-5),
    "complex64": Tolerance(rtol=1e-4, atol=1e-5),
}
EXACT = Tolerance(rtol=0.0, atol=0.0)


def tolerances(through_xla: bool) -> dict[str, Tolerance]:
    """The tolerance table for a mode: :data:`XLA_TOLERANCES` when XLA compiled its graphs, else
    :data:`TOLERANCES`."""
    return XLA_TOLERANCES if through_xla else TOLERANCES


def tolerance_for(dtype_name: str, table: Mapping[str, Tolerance] = TOLERANCES) -> Tolerance:
    return table.get(dtype_name, EXACT)


@dataclass
class TensorDiff:
    """How one named tensor (an output, a gradient) differs between the ``tpu`` run and the CPU reference."""

    name: str
    ok: bool
    max_abs_err: float = 0.0
    ref_scale: float = 0.0
    allowed: float = 0.0
    problem: str = ""  # shape / dtype / non-finite mismatch, or "missing"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.problem:
            return f"{self.name}: {self.problem}"
        return f"{self.name}: max |tpu - cpu| = {self.max_abs_err:.3g} (allowed {self.allowed:.3g}, max |cpu| = {self.ref_scale:.3g})"


def flatten_tensors(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted name, tensor)`` for every tensor in nested mappings, sequences and dataclass-like outputs.

    Hugging Face ``ModelOutput`` objects are mappings; anything else that is not a tensor or a container (a
    cache object, a config) is skipped, because it carries no numbers to compare.
    """
    import torch

    if isinstance(value, torch.Tensor):
        yield prefix or "output", value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from flatten_tensors(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from flatten_tensors(item, f"{prefix}.{index}" if prefix else str(index))


def compare_tensor(name: str, got: Any, ref: Any, table: Mapping[str, Tolerance] = TOLERANCES) -> TensorDiff:
    """Compare one tensor (both already on CPU) against its reference under ``table`` (see :func:`tolerances`)."""
    import torch

    if got is None or ref is None:
        if got is None and ref is None:
            return TensorDiff(name, True)
        return TensorDiff(name, False, problem="present on cpu only" if got is None else "present on tpu only")
    if got.shape != ref.shape:
        return TensorDiff(name, False, problem=f"shape {tuple(got.shape)} on tpu, {tuple(ref.shape)} on cpu")
    if got.dtype != ref.dtype:
        return TensorDiff(name, False, problem=f"dtype {got.dtype} on tpu, {ref.dtype} on cpu")
    dtype_name = str(ref.dtype).removeprefix("torch.")
    tolerance = tolerance_for(dtype_name, table)
    if ref.numel() == 0:
        return TensorDiff(name, True)
    if not (ref.is_floating_point() or ref.is_complex()):
        unequal = int((got != ref).sum())
        return TensorDiff(
            name, unequal == 0, problem="" if unequal == 0 else f"{unequal} of {ref.numel()} values differ"
        )
    wide = torch.complex128 if ref.is_complex() else torch.float64
    got64, ref64 = got.detach().to(wide), ref.detach().to(wide)
    if not torch.equal(got64.isnan(), ref64.isnan()) or not torch.equal(got64.isinf(), ref64.isinf()):
        return TensorDiff(name, False, problem="NaN/inf in different places")
    if not torch.equal(got64[got64.isinf()], ref64[ref64.isinf()]):
        return TensorDiff(name, False, problem="infinities of different sign")
    ref_finite = torch.isfinite(ref64)
    if not bool(ref_finite.any()):
        return TensorDiff(name, True)
    error = float((got64[ref_finite] - ref64[ref_finite]).abs().max())
    scale = float(ref64[ref_finite].abs().max())
    allowed = tolerance.atol + tolerance.rtol * scale
    return TensorDiff(name, error <= allowed, max_abs_err=error, ref_scale=scale, allowed=allowed)


def compare_named(
    got: dict[str, Any],
    ref: dict[str, Any],
    absent_is_zero: bool = False,
    table: Mapping[str, Tolerance] = TOLERANCES,
) -> list[TensorDiff]:
    """Compare two name -> tensor maps under ``table``; a name on one side only is a mismatch, unless
    ``absent_is_zero`` (for gradients) and the side that has it holds only zeros."""
    diffs = []
    for name in dict.fromkeys([*ref, *got]):
        diff = compare_tensor(name, got.get(name), ref.get(name), table)
        if absent_is_zero and not diff.ok and _zero_for_absent(got.get(name), ref.get(name)):
            diff = TensorDiff(name, True)
        diffs.append(diff)
    return diffs


def _zero_for_absent(got: Any, ref: Any) -> bool:
    """Whether one side has no gradient and the other a gradient of zeros: the same gradient, as
    ``torch.autograd.grad`` reports a parameter the loss does not reach (``None``) and as ``torch.compile`` does
    (AOTAutograd fills in zeros for outputs the loss ignores, on the CPU as on the device: BigBird's pooler)."""
    present = got if ref is None else ref if got is None else None
    return present is not None and not bool(present.count_nonzero())


def tolerances_table(table: Mapping[str, Tolerance] = TOLERANCES) -> dict[str, dict[str, float]]:
    """A tolerance table as data, for reports (so a reader sees what "pass" meant)."""
    return {name: asdict(tolerance) for name, tolerance in table.items()}


__all__ = [
    "TOLERANCES",
    "XLA_TOLERANCES",
    "TensorDiff",
    "Tolerance",
    "compare_named",
    "compare_tensor",
    "flatten_tensors",
    "tolerances",
    "tolerances_table",
]
