"""The emulation's face of the ``torch_tpu`` package (TorchTPU 0.2.0's Python surface; guide: torchtpu.readthedocs.io).

``tpu-agent run`` puts the directory above this package on ``PYTHONPATH`` when the real torch_tpu is not installed,
so code written for TorchTPU (``from torch_tpu import api``, ``torch_tpu._internal.execution_mode``, ``OpTracer``,
``sync``, the XProf profiler, Ray Train's ``torch_tpu._loader.load()``) imports and runs unchanged on the emulated
device. Every module is a thin face over the emulation's own state (:mod:`tpu_agent.runtime.emulated`): the eager
mode it sets is the one the dispatcher uses, the ops it traces are the ones the emulation dispatches. Nothing here
keeps a second copy of any setting.

Importing the package loads the backend, as importing the real one does (its ``_loader`` runs on import).
"""

from __future__ import annotations

from . import _loader

_loader.load()

__version__ = "0.2.0+tpu_agent.emulated"
