"""What turns a desynchronised multi-rank program into an error that names the cause, instead of a hang or a
raw transport error: the guard every ``tpu_dist`` collective runs under.

* **Agreement.** Before each collective the ranks all-gather (op, size, sequence number), so a rank that
  issues a different collective, or a buffer of another size, makes every rank raise the same error.
* **Progress.** Each rank writes its last collective into the store; when gloo times out, the error names the
  op and the ranks that never reached it.
* **Departures.** Each rank writes a marker into the store when its process exits; when the transport drops
  a connection ("Connection closed by peer"), the error names the collective and the rank that left.

The store is the rendezvous store (torchrun's agent holds it), so it outlives any one rank.
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

ASYMMETRIC_INPUT = "asymmetric input buffer sizes across ranks are not supported on TPU."

# Codes exchanged in the agreement step (index = code), so ranks can tell which op each of them is in.
OPS = (
    "barrier", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "all_reduce_coalesced",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
)  # fmt: skip
_OP_CODE = {name: code for code, name in enumerate(OPS)}
ANY_SIZE = -1  # all_to_all: TorchTPU accepts uneven splits
_DEPARTED_KEY = "departed/{rank}"
# How gloo reports a peer whose process is gone (the text varies with the side of the socket that noticed).
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed", "read error")
_DEPARTURE_WAIT_S = 2.0  # a leaving rank writes its marker at exit; its socket may close a moment earlier


class CollectiveGuard:
    """Agreement, progress and departure bookkeeping for one process group (rank ``rank`` of ``size``)."""

    def __init__(
        self, store: dist.Store, rank: int, size: int, timeout: timedelta, global_ranks: Callable[[], list[int]]
    ) -> None:
        self._progress = PrefixStore("tpu_dist_progress", store)
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._global_ranks = global_ranks
        self.group_name = ""
        atexit.register(self._mark_departed)

    def _mark_departed(self) -> None:
        try:
            self._progress.set(_DEPARTED_KEY.format(rank=self._rank), "exit")
        except Exception:  # noqa: BLE001 - the store may already be gone at exit; nothing to report then
            pass

    def entering(self, op: str, seq: int) -> None:
        """Record that this rank is entering collective ``seq``."""
        self._progress.set(str(self._rank), f"{seq}:{op}")

    def agree(self, gloo: Any, op: str, seq: int, signature: int) -> None:
        """All-gather (op, size, seq) so every rank sees a mismatch and raises the same error."""
        if self._size == 1:
            return
        mine = torch.tensor([_OP_CODE[op], signature, seq], dtype=torch.int64)
        everyone = torch.empty(self._size * 3, dtype=torch.int64)
        gloo._allgather_base(everyone, mine).wait()
        rows = everyone.view(self._size, 3).tolist()
        ranks = self._global_ranks()
        if any(row[0] != rows[0][0] for row in rows):
            issued = ", ".join(f"rank {ranks[i]} {OPS[row[0]]}" for i, row in enumerate(rows))
            raise RuntimeError(
                f"tpu_dist: ranks issued different collectives as collective #{seq}: {issued}; "
                "every rank must run the same collectives in the same order"
            )
        sizes = {row[1] for row in rows}
        if signature != ANY_SIZE and len(sizes) > 1:
            numels = ", ".join(f"rank {ranks[i]}: {row[1]}" for i, row in enumerate(rows))
            raise RuntimeError(f"{ASYMMETRIC_INPUT} ({op}, elements per rank: {numels})")

    def explain(self, error: RuntimeError, op: str, seq: int) -> RuntimeError | None:
        """A clearer error for a transport failure inside collective ``seq`` (``None``: keep the original)."""
        text = str(error).lower()
        if any(marker in text for marker in _PEER_GONE):
            return RuntimeError(f"{self._departure_message(op, seq)} [{error}]")
        if "timed out" in text or "timeout" in text:
            return RuntimeError(f"{self._hang_message(op, seq)} [{error}]")
        return None

    def _where(self, op: str, seq: int) -> str:
        ranks = self._global_ranks()
        return f"{op} (collective #{seq} of group {self.group_name or 'default'}, ranks {ranks}) on rank {ranks[self._rank]}"

    def _departed(self) -> list[int]:
        ranks = self._global_ranks()
        deadline = time.monotonic() + _DEPARTURE_WAIT_S
        while True:
            gone = [
                ranks[r]
                for r in range(self._size)
                if r != self._rank and self._progress.check([_DEPARTED_KEY.format(rank=r)])
            ]
            if gone or time.monotonic() >= deadline:
                return gone
            time.sleep(0.05)

    def _departure_message(self, op: str, seq: int) -> str:
        try:
            gone = self._departed()
        except Exception:  # noqa: BLE001 - the store went down with the peer; say what is known
            gone = []
        if gone:
            who = ", ".join(f"rank {r}" for r in gone)
            cause = f"{who} exited while this rank waited in it"
        else:
            cause = "a peer rank's process ended (crashed or was killed) while this rank waited in it"
        return (
            f"tpu_dist: {self._where(op, seq)} failed: {cause}. Every rank must reach the same collectives in the "
            "same order (check rank-dependent early returns, and that every rank runs the same number of steps)"
        )

    def _hang_message(self, op: str, seq: int) -> str:
        ranks = self._global_ranks()
        behind = []
        for group_rank, global_rank in enumerate(ranks):
            key = str(group_rank)
            if group_rank == self._rank:
                continue
            if not self._progress.check([key]):
                behind.append(f"rank {global_rank} (no collective yet)")
                continue
            their_seq, _, their_op = self._progress.get(key).decode().partition(":")
            if int(their_seq) < seq:
                behind.append(f"rank {global_rank} (last entered {their_op} #{their_seq})")
        waiting = "; did not reach it: " + ", ".join(behind) if behind else ""
        return (
            f"tpu_dist: {op} (collective #{seq} of group {self.group_name or 'default'}, ranks {ranks}) timed out after "
            f"{self._timeout.total_seconds():g} s on rank {ranks[self._rank]}{waiting}. Every rank must reach the same "
            "collectives in the same order (check rank-dependent branches and early exits)"
        )
