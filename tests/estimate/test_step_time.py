"""A program's time: the compiler's figure, or a roofline where libtpu gives none (it answers -1)."""

from __future__ import annotations

import pytest

from tpu_agent.chips import parse_target
from tpu_agent.estimate.step import program_seconds


def test_the_compilers_time_is_taken_as_it_is() -> None:
    assert program_seconds(0.004, 1e12, 1e9, parse_target("v5e-4")) == (0.004, "compiler")
    assert program_seconds(0.0, 0.0, 0.0, parse_target("v5e")) == (0.0, "compiler")


@pytest.mark.parametrize(
    ("flops", "bytes_accessed", "bound"),
    [(197e12, 1e6, "compute"), (1e6, 819e9, "memory")],  # one second of v5e peak FLOPs, or of HBM bandwidth
)
def test_a_missing_time_becomes_the_roofline_of_the_compilers_flops_and_bytes(
    flops: float, bytes_accessed: float, bound: str
) -> None:
    seconds, timed_by = program_seconds(-1.0, flops, bytes_accessed, parse_target("v5e-8"))
    assert timed_by == "roofline"
    assert seconds == pytest.approx(1.0), bound
