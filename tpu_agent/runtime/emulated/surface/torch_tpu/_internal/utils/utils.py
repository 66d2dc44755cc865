"""``torch_tpu._internal.utils.utils``: the op audit (``OpTracer``) and the parity check (``assert_close``).

``OpTracer`` counts the ATen ops dispatched while it is active, per namespace, as TorchTPU's does; on the emulated
device it also lists the ops the device ran on the host (TorchTPU's CPU fallback: the emulation reports them
through :data:`tpu_agent.runtime.emulated.telemetry.fallback_listeners`) with the user line that issued each, so
the performance cliff the guide tells users to look for in the op counts is named directly.

``assert_close`` compares a device result with its CPU reference (the reference is the ground truth) and, on a
mismatch, reports how many elements differ, the largest absolute and relative differences with their indices, and
the smallest ``atol`` and ``rtol`` that would have passed (with a 1.2 margin), as TorchTPU's numerical-parity guide
describes.
"""

from __future__ import annotations

import collections
import contextlib
import enum
from typing import Any

import torch
from torch.testing._comparison import default_tolerances
from torch.utils._python_dispatch import TorchDispatchMode

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import telemetry

SUGGESTION_MARGIN = 1.2  # suggested tolerances are the smallest passing ones times this


class OpTracer(TorchDispatchMode, contextlib.ContextDecorator):
    """Records the ops dispatched inside it: ``ops_log[namespace][op] = calls``; ``fallbacks[(op, line)] = calls``.

    Usable as a context manager or a decorator. Ops on tpu tensors are seen before the emulated device runs them,
    so the counts are the ATen ops the program asked the device for.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops_log: dict[str, dict[str, int]] = collections.defaultdict(dict)
        self.fallbacks: collections.Counter[tuple[str, str]] = collections.Counter()

    def __enter__(self) -> OpTracer:
        self.ops_log = collections.defaultdict(dict)
        self.fallbacks = collections.Counter()
        telemetry.fallback_listeners.append(self._on_fallback)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            telemetry.fallback_listeners.remove(self._on_fallback)

    def _on_fallback(self, op: str, site: events.Site | None) -> None:
        self.fallbacks[(op, str(site) if site is not None else "<unknown line>")] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        counts = self.ops_log[func.namespace]
        name = str(func)
        counts[name] = counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def num_atens(self) -> int:
        """How many ``aten`` ops were dispatched."""
        return sum(self.ops_log.get("aten", {}).values())

    def _pformat(self) -> str:
        """The counts per namespace, then the CPU fallbacks with their lines (TorchTPU's text, plus that list)."""
        lines = []
        for namespace in sorted(self.ops_log):
            ops = self.ops_log[namespace]
            lines.append(f"Ops for namespace: '{namespace}' ({len(ops)} ops)")
            lines.extend(f"  {op}: {calls}" for op, calls in ops.items())
        if self.fallbacks:
            lines.append(f"CPU fallbacks ({sum(self.fallbacks.values())} calls; each runs on the host)")
            lines.extend(f"  {op} at {site}: {calls}" for (op, site), calls in self.fallbacks.items())
        return "\n".join(lines)


class CheckValueMode(enum.Enum):
    """How values are compared: not at all, ``|a-e| <= atol + rtol*|e|`` (LOOSE), or ``<= min(atol, rtol*|e|)``."""

    SKIP = "skip"
    LOOSE = "loose"
    STRICT = "strict"


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape)) if len(shape) else ()


def _mismatch_report(
    absolute: torch.Tensor, reference: torch.Tensor, bad: torch.Tensor, rtol: float, atol: float
) -> str:
    """Counts, the worst differences and where they are, and the smallest tolerances that would pass."""
    shape = absolute.shape
    count, total = int(bad.sum()), absolute.numel()
    nonzero = reference > 0
    relative = torch.where(nonzero, absolute / torch.where(nonzero, reference, torch.ones_like(reference)), 0.0)
    worst_abs, worst_rel = int(absolute.flatten().argmax()), int(relative.flatten().argmax())
    need_atol = float((absolute - rtol * reference).clamp(min=0).max())  # with this rtol
    over = (absolute - atol).clamp(min=0)  # with this atol; an element whose reference is 0 needs atol itself
    need_rtol = float((over[nonzero] / reference[nonzero]).max()) if bool(nonzero.any()) else 0.0
    lines = [
        f"Mismatched elements: {count} / {total} ({100.0 * count / total:.1f}%) with rtol={rtol:g}, atol={atol:g}",
        f"Greatest absolute difference: {float(absolute.flatten()[worst_abs]):.6g} at index {_index(worst_abs, shape)}",
        f"Greatest relative difference: {float(relative.flatten()[worst_rel]):.6g} at index {_index(worst_rel, shape)}",
        "Tolerance Suggestions (the smallest that pass, times 1.2):",
        f"  atol={need_atol * SUGGESTION_MARGIN:.3g} with rtol={rtol:g}",
    ]
    if not bool((over[~nonzero] > 0).any()):
        lines.append(f"  rtol={need_rtol * SUGGESTION_MARGIN:.3g} with atol={atol:g}")
    return "\n".join(lines)


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    rtol: float | None = None,
    atol: float | None = None,
    preamble: str | None = None,
    check_value: CheckValueMode | None = None,
    check_dtype: bool = True,
) -> None:
    """Raise ``AssertionError`` when ``actual`` (from the device) is not close to ``expected`` (the CPU reference).

    ``rtol``/``atol`` default to torch.testing's tolerances for the dtype; ``check_value`` defaults to LOOSE.
    """
    mode = CheckValueMode.LOOSE if check_value is None else check_value
    prefix = f"{preamble}\n" if preamble else ""
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{prefix}Shapes differ: {tuple(actual.shape)} (actual) vs {tuple(expected.shape)} (expected)"
        )
    if check_dtype and actual.dtype != expected.dtype:
        raise AssertionError(f"{prefix}Dtypes differ: {actual.dtype} (actual) vs {expected.dtype} (expected)")
    if mode is CheckValueMode.SKIP or expected.numel() == 0:
        return
    default_rtol, default_atol = default_tolerances(actual, expected)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    wide = torch.complex128 if expected.is_complex() else torch.float64
    got, ref = actual.detach().cpu().to(wide), expected.detach().cpu().to(wide)
    absolute, reference = (got - ref).abs(), ref.abs()
    if mode is CheckValueMode.LOOSE:
        allowed = atol + rtol * reference
    else:
        allowed = torch.minimum(torch.full_like(reference, atol), rtol * reference)
    equal = got == ref  # also infinities of the same sign
    both_nan = got.isnan() & ref.isnan()
    bad = ~(equal | both_nan | (absolute <= allowed))
    if bool(bad.any()):
        finite = torch.where(torch.isfinite(absolute), absolute, torch.zeros_like(absolute))
        raise AssertionError(prefix + _mismatch_report(finite, reference, bad, rtol, atol))


__all__ = ["CheckValueMode", "OpTracer", "assert_close"]
GUIDE_PAGE = "numerical_parity"  # the TorchTPU notebook that documents this module (read by tpu_lookup_api)
