"""A faithful CPU emulation of TorchTPU's ``tpu`` device (reference: shared/reference/torchtpu_api.md).

``activate()`` makes ``torch.device("tpu")`` usable in this process: tensors, autograd, optimizers, autocast,
the three eager modes, ``torch.compile(backend="tpu")`` and the ``torch.tpu`` module, with TorchTPU's observable
rules (bf16 MXU rounding, internal legacy APIs, one device per process, its error texts). Data lives in CPU
tensors; the runtime event log records what a TPU run would show (flushes, host syncs, compiles, steps).

Where a change goes:

* **An op gives a wrong result, error or layout on ``tpu``.** First the tables of :mod:`.ops` (MXU operands,
  host reads, data-dependent shapes, mixed-device ops, TorchTPU's unsupported ops and dtypes, which
  :mod:`.unsupported` raises). A CPU kernel that refuses inputs the device accepts: a record in
  :mod:`.cpu_gaps`. How an op runs on the CPU data (MXU rounding, device generators, error texts):
  :mod:`.kernels`. Fused attention's kernel choice: :mod:`.attention`. Argument unwrapping, result wrapping and
  in-place layout changes: :mod:`.dispatch`. The same op wrong only under ``--compiler xla``: its lowering (below).
* **A new flush trigger** (something that must run the pending DeferAndFuse graph first): a member of
  :class:`.flush_cause.FlushCause`, then ``deferred.flush(FlushCause.X)`` (``tensor.flush_pending`` from modules
  the recorder imports) where it happens. The recorder's own triggers live in :func:`.deferred.record`.
* **A ``torch.tpu`` API:** :mod:`.tpu_module` (the ``torch.tpu`` module; eager modes and precision in
  :mod:`.modes`, streams and events in :mod:`.streams`, memory in :mod:`.memory`); ``torch_tpu.*`` modules
  are the surface package (``surface/torch_tpu``); ``torch.backends.tpu`` is :mod:`.backends_tpu`.
* **An XLA lowering** (``--compiler xla`` and estimates): :mod:`tpu_agent.runtime.xla.extra_ops` for an op
  torchax lowers wrongly or not at all (written into torchax's table by ``extra_ops.set_lowering``),
  :mod:`tpu_agent.runtime.xla.decompositions` for a decomposition before lowering,
  :mod:`tpu_agent.runtime.xla.tpu_kernels` for TorchTPU's fused kernels as a TPU estimate compiles them.
* **Where data lives and who answers host reads** (estimate's capture-only mode): :mod:`.placement`; what runs a
  flushed graph: ``deferred.set_executor``.
"""

from __future__ import annotations

import atexit
import os
import sys

from tpu_agent.chips import DEFAULT_CHIP, host_devices, parse_target
from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import state
from tpu_agent.runtime.envvars import eager_mode_from_env, recorded_env

_active = False


def is_active() -> bool:
    return _active


def activate(chip: str = DEFAULT_CHIP, eager_mode: str | None = None) -> None:
    """Register the emulated ``tpu`` device for this process (idempotent).

    ``chip`` (a generation, ``v6e``, or a slice, ``v6e-4``) picks what ``torch.tpu.get_device_name`` and
    ``get_device_properties`` report and the host's device count (the slice's host, or the smallest host that
    holds this run's ``LOCAL_WORLD_SIZE`` ranks), of which the process sees one when it is one of several
    (``torch.accelerator.device_count()``, :func:`state.visible_device_count`); ``eager_mode``
    (strict, debug, defer_and_fuse, or a TorchTPU enum name) overrides the TORCH_TPU_* environment default.
    Raises TpuAgentError when another PrivateUse1 backend owns the process.
    """
    global _active
    target = parse_target(chip)
    chosen = target.chip
    mode = state.parse_eager_mode(eager_mode) if eager_mode is not None else None
    state.bind_host(host_devices(target, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))), os.environ)
    if _active:
        state.bind_chip(chosen)
        if mode is not None:
            from tpu_agent.runtime.emulated import modes

            modes.apply_mode(mode)
        return
    from tpu_agent.runtime.emulated import (
        attention,
        autocast,
        compile,
        device,
        lone_rank,
        modes,
        module_conversion,
        mxu,
        process_sharing,
        telemetry,
    )

    device.register()
    attention.install()
    state.bind_chip(chosen)
    autocast.register()
    compile.install()
    telemetry.install()
    lone_rank.install()
    module_conversion.install()
    mxu.install()
    process_sharing.install()
    modes.apply_mode(mode if mode is not None else state.parse_eager_mode(eager_mode_from_env(os.environ)[0].enum_name))
    atexit.register(_at_exit)
    _active = True
    if state.log_enabled:
        events.emit(
            events.RunInfo,
            backend="emulated",
            chip=chosen.key,
            eager_mode=state.eager_mode.value,
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            argv=list(sys.argv),
            env=recorded_env(os.environ),
        )


def _at_exit() -> None:
    from tpu_agent.runtime.emulated import deferred, telemetry
    from tpu_agent.runtime.emulated.flush_cause import FlushCause

    try:
        deferred.flush(FlushCause.EXIT)
    finally:
        telemetry.emit_op_batch()
        events.get_log().flush()


__all__ = ["activate", "is_active"]
