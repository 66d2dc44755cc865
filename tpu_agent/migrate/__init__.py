"""Rewrite CUDA-specific PyTorch code into device-agnostic ``torch.accelerator`` / TorchTPU code.

The public surface is two calls: :func:`plan` examines files and returns a :class:`~tpu_agent.migrate.model.Plan`
(touching nothing), :func:`apply` writes it (atomically, refusing stale, dirty or escaping files).
Reports of a plan come from :func:`tpu_agent.migrate.report.render`; the rules from
:mod:`tpu_agent.migrate.rules`. The CLI and the MCP server are thin front ends over these.
"""

from tpu_agent.migrate.api import apply, plan

__all__ = ["apply", "plan"]
