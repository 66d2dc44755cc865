"""tpu-agent for coding agents: the MCP server, its sandbox and jobs, the plugin bundle and the installer.

* :mod:`~tpu_agent.plugins.server` -- ``tpu-agent mcp``: assembles the server from the tool modules.
* :mod:`~tpu_agent.plugins.tools` -- the tools, one module per area, over the migrate, runtime and profile APIs.
* :mod:`~tpu_agent.plugins.limits` -- every bound on what an agent may send or start.
* :mod:`~tpu_agent.plugins.workspace` -- which directory the tools work in, the path sandbox, the state dir.
* :mod:`~tpu_agent.plugins.plans` -- migration plans stored between planning and applying.
* :mod:`~tpu_agent.plugins.jobs` -- runs and profiles as bounded, cancellable subprocess jobs, each led by
  :mod:`~tpu_agent.plugins.jobguard`, which takes the job down with the server.
* :mod:`~tpu_agent.plugins.api_lookup` -- the CUDA-to-TorchTPU API lookup, answered from the migration rule
  records (``Rule.apis``).
* :mod:`~tpu_agent.plugins.bundles` and :mod:`~tpu_agent.plugins.build` -- the one canonical plugin source
  and ``tpu-agent plugin build``, which renders the ``plugin/`` directory every harness installs.
* :mod:`~tpu_agent.plugins.install` -- ``tpu-agent plugin install|print-config`` for each harness's config.
"""
