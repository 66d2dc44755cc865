"""``tpu-agent check``: validate a model on the ``tpu`` device the way TorchTPU's model pipeline does.

Flow: MODEL spec (Hugging Face type, local directory, ``module:factory``) -> build on CPU -> CPU reference ->
each mode (Strict, DeferAndFuse, ``torch.compile(backend="tpu")``) in its own worker -> compare outputs and
gradients under stated tolerances -> on a divergence, the first diverging submodule and the op inside it ->
one :class:`CheckReport`. The CLI, the MCP server and ``benchmarks/hf_coverage.py`` all call
:func:`check_model`.
"""

from tpu_agent.check.api import CheckOptions, check_model
from tpu_agent.check.model import (
    MODES,
    CheckReport,
    ErrorInfo,
    Localisation,
    ModelInfo,
    ModeResult,
)
from tpu_agent.check.spec import ModelSpec, parse_model_spec

__all__ = [
    "MODES",
    "CheckOptions",
    "CheckReport",
    "ErrorInfo",
    "Localisation",
    "ModeResult",
    "ModelInfo",
    "ModelSpec",
    "check_model",
    "parse_model_spec",
]
