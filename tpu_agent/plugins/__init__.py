"""tpu-agent for coding agents: the MCP server, its sandbox and jobs, the plugin bundle and the installer.

* :mod:`~tpu_agent.plugins.server` -- ``tpu-agent mcp``: tools over the migrate, runtime and profile APIs.
* :mod:`~tpu_agent.plugins.workspace` -- which directory the tools work in, and the path sandbox.
* :mod:`~tpu_agent.plugins.plans` -- migration plans stored between planning and applying.
* :mod:`~tpu_agent.plugins.jobs` -- runs and profiles as bounded, cancellable subprocess jobs.
* :mod:`~tpu_agent.plugins.api_lookup` -- the CUDA-to-TorchTPU mapping table (``data/cuda_to_tpu.json``).
* :mod:`~tpu_agent.plugins.bundles` and :mod:`~tpu_agent.plugins.build` -- the one canonical plugin source
  and ``tpu-agent plugin build``, which renders the ``plugin/`` directory every harness installs.
* :mod:`~tpu_agent.plugins.install` -- ``tpu-agent plugin install|print-config`` for each harness's config.
"""
