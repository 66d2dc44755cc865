"""The option keys TorchTPU's ``torch.compile(..., backend="tpu", options={...})`` takes (reference §3.2).

Shared by the runtime's backend, which refuses any other key as TorchTPU does, and by the profiler's advice,
which reads a script's compile call from its source without importing torch.
"""

from __future__ import annotations

OPTION_KEYS = frozenset(
    {
        "async_compile",
        "num_dynamic_buckets",
        "bucket_size",
        "serializable",
        "debug_callback",
        "custom_module_name",
        "name",
    }
)
