"""The chip table against Google's published Cloud TPU figures (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e,
/tpu7x): the estimate's roofline time, MFU and verdict are only as right as these numbers."""

from __future__ import annotations

import pytest

from tpu_agent.chips import CHIPS, GIB

# generation: (peak bf16 TFLOP/s per chip, HBM GiB per chip, HBM GB/s per chip or None where unpublished here)
PUBLISHED = {
    "v4": (275, 32, 1200),
    "v5e": (197, 16, 819),
    "v5p": (459, 95, 2765),
    "v6e": (918, 32, 1638),
    "v7": (2307, 192, None),
}


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_each_generation_has_its_published_peak_memory_and_bandwidth(key: str) -> None:
    tflops, gib, bandwidth = PUBLISHED[key]
    chip = CHIPS[key]
    assert chip.peak_bf16_flops_per_chip == tflops * 1e12
    assert chip.hbm_bytes_per_chip == gib * GIB
    if bandwidth is not None:
        assert chip.hbm_bandwidth_bytes_per_s == bandwidth * 1e9
