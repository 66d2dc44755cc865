"""TPU targets without a TPU: step programs compiled by libtpu's deviceless AOT compiler into one
:class:`~tpu_agent.estimate.model.CompiledEstimate` (HBM by kind against the chip's, compiler FLOPs / bytes /
``optimal_seconds``, fusions, collectives, a fits / does-not-fit verdict and fixes checked by compiling).

* :mod:`.compiler`: the slice's topology, the compile itself (libtpu's stderr noise filtered); whether libtpu is
  here is :mod:`tpu_agent.runtime.tpu_compiler`'s (``tpu-agent doctor`` reports it too).
* :mod:`.hlo`: the optimized HLO's breakdown (fusions, collectives and bytes, costliest matmuls, tile padding).
* :mod:`.step`: sharding strategies, per-chip memory attribution, suggestions.
* :mod:`.model` and :mod:`.report`: the one result model and its renderers.
"""

from tpu_agent.estimate.model import ArgRole, ArgSpec, CompiledEstimate, StepProgram
from tpu_agent.estimate.options import STRATEGIES
from tpu_agent.estimate.step import estimate_step, suggest_fixes
from tpu_agent.runtime.tpu_compiler import CompilerStatus, compiler_status

__all__ = [
    "STRATEGIES",
    "ArgRole",
    "ArgSpec",
    "CompilerStatus",
    "CompiledEstimate",
    "StepProgram",
    "compiler_status",
    "estimate_step",
    "suggest_fixes",
]
