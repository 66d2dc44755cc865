"""The ATen op classes the profile reads by name, owned here so that the trace reader, the estimate and the rules
agree on what a matmul is.

``MATMUL_OPS`` are the matrix products whose FLOPs follow from ``(batch, M, K, N)``; ``CONV_OPS`` the convolutions,
costed from their concrete arguments; ``MXU_OPS`` both, the ops the TPU's matrix unit runs (what the rules mean by
"a matmul": its padding, its dtype, its share of the step).
"""

from __future__ import annotations

MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
CONV_OPS = frozenset({"aten::convolution"})
MXU_OPS = MATMUL_OPS | CONV_OPS
