"""Why a DeferAndFuse flush ran the pending graph: the one list of flush causes.

Every flush names its cause with a :class:`FlushCause`; the runtime event log writes the member's value into
:class:`tpu_agent.runtime.events.Flush` (``cause``), where ``tpu-agent profile`` counts and shows it. The values
are the strings captures have always carried, so captures written before this enum existed read the same. A
new flush trigger adds its member here (see the map in :mod:`tpu_agent.runtime.emulated`).

The host-read members double as :class:`tpu_agent.runtime.events.HostSync` ``op`` names: a host read is both a
host sync and, when work is pending, a flush.
"""

from __future__ import annotations

import enum


class FlushCause(str, enum.Enum):
    """What made the pending graph run (a ``str``: compares, formats and serialises as its value)."""

    def __str__(self) -> str:  # the value, as enum.StrEnum (3.11+) gives
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    # host reads of a tensor's value (reference §2.4)
    ITEM = "item"
    TOLIST = "tolist"
    BOOL = "bool"
    FLOAT = "float"
    INT = "int"
    PRINT = "print"
    NUMPY = "numpy"
    SAVE = "save"
    CPU = "cpu"  # a copy to the host (``.cpu()``, ``.to("cpu")``), or any read that needs the data now
    # explicit waits
    SYNCHRONIZE = "synchronize"  # torch.tpu.synchronize / torch.accelerator.synchronize
    STREAM_SYNCHRONIZE = "stream_synchronize"
    EVENT_RECORD = "event_record"
    # the program's structure
    COLLECTIVE = "collective"  # tpu_dist collectives run eagerly on materialised inputs
    COMPILE = "compile"  # a torch.compile graph reads its inputs' data
    MODE_CHANGE = "mode_change"  # leaving DeferAndFuse: recorded work never runs under another mode's rules
    EXIT = "exit"
    # what the recorder cannot defer
    SIZE_LIMIT = "size_limit"  # the graph reached deferred.MAX_GRAPH_OPS
    DATA_DEPENDENT = "data_dependent"  # an op whose output shape depends on values (nonzero, masked_select)
    FALLBACK = "fallback"  # an op whose shapes meta inference cannot give, or that changes storage
    STORAGE = "storage"  # the program asked for a tensor's memory (untyped_storage, data_ptr)
    LAYOUT_CHANGE = "layout_change"  # an out= op changes the layout of a tensor pending ops still read
    RNG_STATE = "rng_state"  # reading or seeding a generator pending draws use
    SWAP_TENSORS = "swap_tensors"  # a module's dtype/device conversion swaps tensor objects
    # tpu-agent estimate's capture (tpu_agent.estimate.capture, .capture_only)
    OPTIMIZER_STEP = "optimizer_step"
    ESTIMATE = "estimate"
    CAPTURE_ONLY = "capture_only"  # switching into capture-only mode
    CAPTURE_ONLY_SMALL = "capture_only_small"  # a small op on real inputs computed for real under capture-only
