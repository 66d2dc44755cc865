"""``tpu_dist``: TorchTPU's c10d backend, emulated by gloo on the CPU data behind ``tpu`` tensors.

TorchTPU registers ``"tpu_dist"`` and ``"tpu"`` (both ``devices=["tpu"]``) and makes ``tpu_dist`` the default
backend of the ``tpu`` device (reference §4.1), so ``init_process_group()``, ``init_process_group("tpu_dist")``
and ``"cpu:gloo,tpu:tpu_dist"`` all work; :func:`register` does the same here.

:class:`ProcessGroupTpu` is a Python ``dist.ProcessGroup``: torch's C++ callers (DDP's reducer, functional
collectives used by DTensor and FSDP2) reach its Python methods through the ProcessGroup trampoline, and
``torch.distributed``'s Python functions call them directly. Each collective

1. materialises pending DeferAndFuse work (a flush with cause ``collective``: TorchTPU forces eager collectives
   into their own graph, reference §8.1 ``..._MATERIALIZE_COLLECTIVE_TENSORS``; :mod:`.collective_staging`),
2. checks TorchTPU's restrictions (no ``reduce``, ``monitored_barrier``, ``PREMUL_SUM``, barrier options, or
   buffer sizes that differ across ranks; :data:`.collective_restrictions.RESTRICTIONS`),
3. agrees with the other ranks on what is being run (:mod:`collective_guard`: a tiny gloo all-gather of op,
   size and sequence number), which turns a desynchronised program or uneven sizes into an error on every
   rank instead of a hang,
4. runs the gloo collective in place on the CPU tensors (results land in the ``tpu`` tensors, which share
   that data) and emits a :class:`~tpu_agent.runtime.events.Collective` event.

Hangs and departures: when gloo times out, or a peer's process is gone, the guard's error names the op and the
ranks that never reached it or that left. FSDP2's storage resizing is the device's own (:mod:`storage`).
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from tpu_agent.runtime import events
from tpu_agent.runtime.emulated import async_collectives
from tpu_agent.runtime.emulated.collective_guard import ANY_SIZE, CollectiveGuard
from tpu_agent.runtime.emulated.collective_restrictions import UNSET_TIMEOUT, restricted
from tpu_agent.runtime.emulated.collective_staging import (
    DEVICE_TYPE,
    DoneWork,
    Staged,
    flush_if_tpu,
    nbytes,
    same_shapes,
)

BACKEND_NAMES = ("tpu_dist", "tpu")
collectives_run = 0  # in this process, on any tpu_dist group (:mod:`lone_rank` reads it)


# Every gloo group stays alive until the interpreter is about to exit. Its destructor joins gloo's worker threads
# while holding the GIL; a worker that is still releasing a just-finished collective's tensors needs the GIL to
# drop their Python objects, so destroying the group right after a collective (DDP's Reducer going out of
# scope after ``barrier()``/``destroy_process_group()``) deadlocked about one 2-rank run in three. Left to the
# interpreter's finalization, the same late release aborts the process instead ("terminate called without an
# active exception": the worker cannot take the GIL of an interpreter being torn down; see
# https://github.com/pytorch/pytorch/pull/179291). So at exit, while the interpreter is whole, the workers get
# the GIL long enough to finish their releases, and then the groups are destroyed (:func:`_quiesce_at_exit`).
_GLOO_GROUPS: list[ProcessGroupGloo] = []
_WORKERS_RELEASE_S = 0.05  # far longer than a worker needs to drop one collective's tensors


@atexit.register
def _quiesce_at_exit() -> None:
    if _GLOO_GROUPS:
        time.sleep(_WORKERS_RELEASE_S)  # sleeping releases the GIL to gloo's workers
        _GLOO_GROUPS.clear()


class ProcessGroupTpu(dist.ProcessGroup):
    """The emulated ``ProcessGroupTpu``: TorchTPU's collective semantics, executed by gloo on the CPU."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        # typed Any: gloo's collectives are bound in C++ and absent from torch's type stubs
        self._gloo: Any = ProcessGroupGloo(PrefixStore("gloo", store), rank, size, timeout)
        _GLOO_GROUPS.append(self._gloo)
        self._guard = CollectiveGuard(store, rank, size, timeout, self._global_ranks)
        self._seq = 0
        self._group_desc = ""
        # C++ paths this class cannot override (e.g. ProcessGroup::all_gather_single) dispatch to the
        # registered backend; gloo then works on the CPU data the tpu tensor subclass hands it.
        for device in ("cpu", DEVICE_TYPE):
            self._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, self._gloo)

    # ------------------------------------------------------------------------------ identity (trampoline)

    def getBackendName(self) -> str:  # noqa: N802 - the C++ virtual's name
        return "tpu_dist"

    def getGroupName(self) -> str:  # noqa: N802
        return self._guard.group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._guard.group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def name(self) -> str:
        return "tpu_dist"

    # ------------------------------------------------------------------------------------- machinery

    def _global_ranks(self) -> list[int]:
        try:
            return dist.get_process_group_ranks(self)
        except (ValueError, RuntimeError, KeyError):
            return list(range(self.size()))

    def _run(
        self,
        op: str,
        tensors: Sequence[torch.Tensor],
        signature: int,
        body: Callable[[Staged], list[torch.Tensor]],
    ) -> DoneWork:
        """Flush, agree with the other ranks, run ``body`` on staged CPU tensors, emit the event."""
        global collectives_run
        collectives_run += 1
        flush_if_tpu(tensors)
        self._seq += 1
        seq = self._seq
        start = time.perf_counter_ns()
        self._guard.entering(op, seq)
        try:
            self._guard.agree(self._gloo, op, seq, signature)
            staged = Staged()
            result = body(staged)
            staged.finish()
        except RuntimeError as error:
            explained = self._guard.explain(error, op, seq)
            if explained is not None:
                raise explained from None
            raise
        self._emit(op, tensors, start)
        return DoneWork(result)

    def _emit(self, op: str, tensors: Sequence[torch.Tensor], start_ns: int) -> None:
        if events.get_log().enabled:
            events.emit(
                events.Collective,
                op=op,
                bytes=nbytes(tensors),
                group_size=self.size(),
                duration_ns=time.perf_counter_ns() - start_ns,
                site=events.user_call_site(),
            )

    @staticmethod
    def _reduce_op(opts: Any) -> tuple[Any, bool]:
        """The gloo ReduceOp for ``opts`` and whether to divide by the group size afterwards (AVG)."""
        red = opts.reduceOp
        if red.op == dist.ReduceOp.RedOpType.PREMUL_SUM:
            raise restricted("premul_sum")
        if red.op == dist.ReduceOp.RedOpType.AVG:
            # TorchTPU lowers AVG to SUM and a divide ("'avg' reduction should be handled using 'sum'").
            return dist.ReduceOp.SUM, True
        return red, False

    def _average(self, tensors: Sequence[torch.Tensor]) -> None:
        for t in tensors:
            t.div_(self.size()) if t.is_floating_point() or t.is_complex() else t.floor_divide_(self.size())

    # ---------------------------------------------------------------------------------- collectives

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> DoneWork:
        opts = opts or dist.AllreduceOptions()
        red, average = self._reduce_op(opts)

        def body(staged: Staged) -> list[torch.Tensor]:
            cpu = staged.cpus(tensors)
            gloo_opts = dist.AllreduceOptions()
            gloo_opts.reduceOp = red
            self._gloo.allreduce(cpu, gloo_opts).wait()
            if average:
                self._average(cpu)
            return tensors

        return self._run("all_reduce", tensors, sum(t.numel() for t in tensors), body)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> DoneWork:
        single = dist.AllreduceOptions()
        if opts is not None:
            single.reduceOp = opts.reduceOp
        red, average = self._reduce_op(single)

        def body(staged: Staged) -> list[torch.Tensor]:
            cpu = staged.cpus(tensors)
            gloo_opts = dist.AllreduceOptions()
            gloo_opts.reduceOp = red
            for t in cpu:
                self._gloo.allreduce([t], gloo_opts).wait()
            if average:
                self._average(cpu)
            return tensors

        return self._run("all_reduce_coalesced", tensors, sum(t.numel() for t in tensors), body)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> DoneWork:
        opts = opts or dist.BroadcastOptions()

        def body(staged: Staged) -> list[torch.Tensor]:
            gloo_opts = dist.BroadcastOptions()
            gloo_opts.rootRank, gloo_opts.rootTensor = opts.rootRank, opts.rootTensor
            self._gloo.broadcast(staged.cpus(tensors), gloo_opts).wait()
            return tensors

        return self._run("broadcast", tensors, sum(t.numel() for t in tensors), body)

    def allgather(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> DoneWork:
        for outputs, tensor in zip(output_lists, inputs, strict=True):
            if not same_shapes(outputs, tensor):
                raise restricted("asymmetric_output")

        def body(staged: Staged) -> list[torch.Tensor]:
            cpu_outputs = [staged.cpus(outputs) for outputs in output_lists]
            self._gloo.allgather(cpu_outputs, staged.cpus(inputs)).wait()
            return [t for outputs in output_lists for t in outputs]

        flat = [t for outputs in output_lists for t in outputs]
        return self._run("all_gather", [*inputs, *flat], sum(t.numel() for t in inputs), body)

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> DoneWork:
        return self._gather_into("all_gather_into_tensor", [output], [tensor])

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> DoneWork:
        return self._gather_into("all_gather_into_tensor_coalesced", outputs, inputs)

    # torch < 2.13 and the C++ trampoline's fallback names for the same two operations.
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _gather_into(self, op: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> DoneWork:
        for output, tensor in zip(outputs, inputs, strict=True):
            if output.numel() != tensor.numel() * self.size():
                raise restricted("asymmetric_output")

        def body(staged: Staged) -> list[torch.Tensor]:
            for output, tensor in zip(outputs, inputs, strict=True):
                self._gloo._allgather_base(staged.cpu(output), staged.cpu(tensor)).wait()
            return outputs

        return self._run(op, [*inputs, *outputs], sum(t.numel() for t in inputs), body)

    def reduce_scatter(
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> DoneWork:
        opts = opts or dist.ReduceScatterOptions()
        red, average = self._reduce_op(opts)
        for output, inputs in zip(outputs, input_lists, strict=True):
            if not same_shapes(inputs, output):
                raise restricted("asymmetric_input")

        def body(staged: Staged) -> list[torch.Tensor]:
            gloo_opts = dist.ReduceScatterOptions()
            gloo_opts.reduceOp = red
            cpu_outputs = staged.cpus(outputs)
            self._gloo.reduce_scatter(cpu_outputs, [staged.cpus(inputs) for inputs in input_lists], gloo_opts).wait()
            if average:
                self._average(cpu_outputs)
            return outputs

        flat = [t for inputs in input_lists for t in inputs]
        return self._run("reduce_scatter", [*outputs, *flat], sum(t.numel() for t in outputs), body)

    def reduce_scatter_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> DoneWork:
        return self._scatter_from("reduce_scatter_tensor", [output], [tensor], opts)

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> DoneWork:
        return self._scatter_from("reduce_scatter_tensor_coalesced", outputs, inputs, opts)

    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _scatter_from(self, op: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> DoneWork:
        single = dist.ReduceScatterOptions()
        if opts is not None:
            single.reduceOp = opts.reduceOp
        red, average = self._reduce_op(single)
        for output, tensor in zip(outputs, inputs, strict=True):
            if tensor.numel() != output.numel() * self.size():
                raise restricted("asymmetric_input")

        def body(staged: Staged) -> list[torch.Tensor]:
            gloo_opts = dist.ReduceScatterOptions()
            gloo_opts.reduceOp = red
            for output, tensor in zip(outputs, inputs, strict=True):
                cpu_output = staged.cpu(output)
                self._gloo._reduce_scatter_base(cpu_output, staged.cpu(tensor), gloo_opts).wait()
                if average:
                    self._average([cpu_output])
            return outputs

        return self._run(op, [*outputs, *inputs], sum(t.numel() for t in outputs), body)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: Any = None,
    ) -> DoneWork:
        def body(staged: Staged) -> list[torch.Tensor]:
            self._gloo.alltoall_base(staged.cpu(output), staged.cpu(tensor), output_splits, input_splits).wait()
            return [output]

        return self._run("all_to_all_single", [output, tensor], ANY_SIZE, body)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> DoneWork:
        def body(staged: Staged) -> list[torch.Tensor]:
            # gloo has no list all_to_all: one all_to_all_single per peer pair, through flat buffers.
            flat_in = torch.cat([staged.cpu(t).reshape(-1) for t in inputs])
            flat_out = torch.empty(sum(t.numel() for t in outputs), dtype=flat_in.dtype)
            self._gloo.alltoall_base(
                flat_out, flat_in, [t.numel() for t in outputs], [t.numel() for t in inputs]
            ).wait()
            for t, piece in zip(outputs, flat_out.split([o.numel() for o in outputs]), strict=True):
                staged.cpu(t).copy_(piece.view(t.shape))
            return outputs

        return self._run("all_to_all", [*outputs, *inputs], ANY_SIZE, body)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> DoneWork:
        opts = opts or dist.GatherOptions()
        for outputs in output_lists:
            if not same_shapes(outputs, inputs[0]):
                raise restricted("asymmetric_output")

        def body(staged: Staged) -> list[torch.Tensor]:
            gloo_opts = dist.GatherOptions()
            gloo_opts.rootRank = opts.rootRank
            self._gloo.gather([staged.cpus(o) for o in output_lists], staged.cpus(inputs), gloo_opts).wait()
            return [t for o in output_lists for t in o]

        flat = [t for o in output_lists for t in o]
        return self._run("gather", [*inputs, *flat], sum(t.numel() for t in inputs), body)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> DoneWork:
        opts = opts or dist.ScatterOptions()
        for inputs in input_lists:
            if not same_shapes(inputs, outputs[0]):
                raise restricted("asymmetric_input")

        def body(staged: Staged) -> list[torch.Tensor]:
            gloo_opts = dist.ScatterOptions()
            gloo_opts.rootRank = opts.rootRank
            self._gloo.scatter(staged.cpus(outputs), [staged.cpus(i) for i in input_lists], gloo_opts).wait()
            return outputs

        flat = [t for i in input_lists for t in i]
        return self._run("scatter", [*outputs, *flat], sum(t.numel() for t in outputs), body)

    def barrier(self, opts: Any = None) -> DoneWork:
        if opts is not None:
            if opts.timeout != UNSET_TIMEOUT:
                raise restricted("barrier_timeout")
            if list(opts.device_ids) not in ([], [0]):
                raise restricted("barrier_device_ids")

        # ``_run``'s agreement all-gather already waits for every rank, so the barrier needs no gloo call of its own.
        return self._run("barrier", [], 0, lambda staged: [])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> DoneWork:
        flush_if_tpu(tensors)
        start = time.perf_counter_ns()
        self._gloo.send(Staged().cpus(tensors), dst, tag).wait()
        self._emit("send", tensors, start)
        return DoneWork(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> DoneWork:
        flush_if_tpu(tensors)
        start = time.perf_counter_ns()
        staged = Staged()
        self._gloo.recv(staged.cpus(tensors), src, tag).wait()
        staged.finish()
        self._emit("recv", tensors, start)
        return DoneWork(tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> DoneWork:
        raise restricted("recv_anysource")

    # ------------------------------------------------------------------------ unsupported by TorchTPU

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> DoneWork:
        raise restricted("reduce")

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        raise restricted("monitored_barrier")


_COLLECTIVES = (
    "allreduce", "allreduce_coalesced", "broadcast", "allgather", "all_gather_single", "all_gather_single_coalesced",
    "reduce_scatter", "reduce_scatter_single", "reduce_scatter_single_coalesced", "all_to_all_single", "alltoall",
    "gather", "scatter", "barrier", "send", "recv",
)  # fmt: skip


def keep_dynamo_out() -> None:
    """Make every collective a graph break that runs eagerly, as a C++ process group's call would be.

    Dynamo cannot trace into a Python ProcessGroup (a TorchScript object), e.g. DDP's buffer broadcast in a
    compiled module. Called once, when the tpu backend sets Dynamo up (``compile._register``): wrapping at
    import would import Dynamo in every run, a cost that runs which never compile should not pay.
    """
    for name in _COLLECTIVES:
        setattr(ProcessGroupTpu, name, torch.compiler.disable(getattr(ProcessGroupTpu, name)))


def create_process_group(store: dist.Store, rank: int, size: int, timeout: timedelta) -> ProcessGroupTpu:
    """The c10d creator function registered for ``tpu_dist`` and ``tpu``."""
    # here rather than at activation: single-process runs never pay the functional-collective imports
    async_collectives.patch()
    return ProcessGroupTpu(store, rank, size, timeout)


def register() -> None:
    """Register ``tpu_dist`` and ``tpu`` for the ``tpu`` device, as TorchTPU's device init does; idempotent.

    Like TorchTPU, nothing is registered once a process group exists (registration must precede
    ``init_process_group``), and ``tpu_dist`` becomes the default backend of the ``tpu`` device.
    """
    if dist.is_initialized():
        return
    for name in BACKEND_NAMES:
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, create_process_group, devices=[DEVICE_TYPE])
    dist.Backend.default_device_backend_map[DEVICE_TYPE] = BACKEND_NAMES[0]
