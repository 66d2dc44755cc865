"""``torch_tpu._internal.profiler``: ``profile(activities, on_trace_ready=xprof_trace_handler(dir_name))``.

TorchTPU's legacy profiler writes an XProf session under ``dir_name`` (``plugins/profile/<session>/``). Here the
block runs under ``torch.profiler`` (the host's ATen ops, with shapes) and, when it ends, the ops become an
XSpace file in the same layout, written by the project's own writer (:mod:`tpu_agent.profile.xplane`), so
TensorBoard's Profile tab, ``xprof`` and ``tpu-agent diagnose DIR`` open it. Each ``optimizer.step()`` in the
block ends a step (TorchTPU marks steps with annotations on the device; the emulation has only the host), so the
overview and ``diagnose`` measure step times. The emulated device has no device timeline:
``ProfilerActivity.TPU`` adds no ``/device:TPU`` plane, and the file says so in its warnings.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from tpu_agent.profile import kineto, xplane
from tpu_agent.profile.model import RankProfile, Step

NO_DEVICE_PLANE = "tpu-agent emulation: no /device:TPU plane (the emulated device runs ATen ops on the host)"


class ProfilerActivity(enum.Enum):
    """What to trace: host (CPU) activity, TPU activity; GPU is refused, as by TorchTPU."""

    CPU = 1
    TPU = 2
    GPU = 3


def xprof_trace_handler(dir_name: os.PathLike[str] | str, worker_rank: str | None = None) -> Callable[[Any], str]:
    """The ``on_trace_ready`` handler: the session goes under ``dir_name``; ``worker_rank`` names the file."""

    def handler(prof: Any) -> str:
        return str(dir_name)

    handler.worker_rank = worker_rank  # type: ignore[attr-defined]
    return handler


_running = False


def _write_session(
    log_dir: Path, ops_trace: Path, boundaries: list[int], worker_rank: str | None, activities: list[ProfilerActivity]
) -> Path:
    rank_id = (
        int(worker_rank) if worker_rank is not None and str(worker_rank).isdigit() else int(os.environ.get("RANK", "0"))
    )
    rank = RankProfile(rank=rank_id, host=socket.gethostname(), ops=kineto.read_ops(ops_trace))
    rank.has_op_trace = bool(rank.ops)
    rank.steps = [Step(i, start, end, "optimizer") for i, (start, end) in enumerate(itertools.pairwise(boundaries))]
    if ProfilerActivity.TPU in activities:
        rank.warnings.append(NO_DEVICE_PLANE)
    session = log_dir / "plugins" / "profile" / xplane.session_name()
    log_dir.mkdir(parents=True, exist_ok=True)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # several ranks: each file is named by its rank
    (path,) = xplane.write_session(session, [rank], [], world_size=world_size, root=log_dir)
    return path


@contextlib.contextmanager
def profile(
    activities: list[ProfilerActivity] | None = None, on_trace_ready: Callable[[Any], str] | None = None
) -> Iterator[None]:
    """Trace the block and write an XProf session into the directory ``on_trace_ready`` names."""
    global _running
    if not on_trace_ready:
        raise ValueError("on_trace_ready must be provided for profiler.profile.")
    chosen = [ProfilerActivity.CPU, ProfilerActivity.TPU] if activities is None else list(activities)
    if ProfilerActivity.GPU in chosen:
        raise ValueError("GPU profiling is not supported.")
    if _running:
        raise RuntimeError("Only one profile may be run at a time.")
    log_dir = Path(on_trace_ready(None))
    _running = True
    boundaries = [time.time_ns()]  # the block's start, then the end of each optimizer step
    hook = register_optimizer_step_post_hook(lambda *_: boundaries.append(time.time_ns()))
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            yield None
        with tempfile.TemporaryDirectory(prefix="tpu-agent-profile-") as scratch:
            trace = Path(scratch) / "trace.json"
            prof.profiler.kineto_results.save(str(trace))
            _write_session(log_dir, trace, boundaries, getattr(on_trace_ready, "worker_rank", None), chosen)
    finally:
        hook.remove()
        _running = False


# TorchTPU forbids it inside a compiled region: the profiled code would run eagerly and the trace mislead.
profile = torch._dynamo.forbid_in_graph(profile)

__all__ = ["ProfilerActivity", "profile", "xprof_trace_handler"]
GUIDE_PAGE = "performance_profiling"  # the TorchTPU notebook that documents this module (read by tpu_lookup_api)
