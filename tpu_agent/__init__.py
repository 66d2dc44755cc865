"""tpu-agent: move CUDA PyTorch code onto Google TPUs through TorchTPU, and tune it.

Subpackages, one job each:

* :mod:`tpu_agent.migrate` rewrites CUDA/NCCL code into ``torch.accelerator`` + TorchTPU forms.
* :mod:`tpu_agent.runtime` runs scripts on real TorchTPU, or on a CPU emulation of its ``tpu`` device.
* :mod:`tpu_agent.profile` captures XProf-viewable profiles and turns them into diagnostics.
* :mod:`tpu_agent.plugins` exposes all of the above to coding agents over MCP.
"""

__version__ = "0.1.0"
