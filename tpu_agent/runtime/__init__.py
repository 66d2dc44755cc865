"""Run PyTorch code on TorchTPU's ``tpu`` device: real ``torch_tpu`` on a TPU host, a CPU emulation elsewhere.

Public API: :mod:`tpu_agent.runtime.api` (``launch``, ``LaunchTarget``, ``RunOptions``, ``select_backend``,
``doctor``, ``activate``); ``tpu-agent run SCRIPT`` (or ``python -m tpu_agent run SCRIPT``) is its CLI. Per-rank
entry: :mod:`tpu_agent.runtime.bootstrap`; multi-rank agent: :mod:`tpu_agent.runtime.elastic`; the emulated
device and its ``tpu_dist`` process group: :mod:`tpu_agent.runtime.emulated`. Nothing is imported here, so
importing a submodule (e.g. the event log) never pulls in torch.
"""
