"""Another PrivateUse1 backend owns the process: activate() must refuse with a TpuAgentError."""

import torch

from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.emulated import activate

torch.utils.rename_privateuse1_backend("otherdev")
try:
    activate()
except TpuAgentError as e:
    print("REFUSED", e.code, e.exit_code.name)
