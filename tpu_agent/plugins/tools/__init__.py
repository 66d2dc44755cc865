"""The MCP server's tools, one module per area, each a list of :class:`~.common.ToolSpec` records.

* :mod:`~tpu_agent.plugins.tools.common` -- server state, the closed-argument tool class, error format.
* :mod:`~tpu_agent.plugins.tools.args` -- every argument type, its description and declared limits.
* :mod:`~tpu_agent.plugins.tools.doctor` -- ``tpu_doctor``.
* :mod:`~tpu_agent.plugins.tools.migrate` -- scan, plan, apply, rule explanations, API lookup.
* :mod:`~tpu_agent.plugins.tools.jobs` -- run, profile and estimate jobs, their status and cancellation.
* :mod:`~tpu_agent.plugins.tools.check` -- ``tpu_check``, a model check as a job.
* :mod:`~tpu_agent.plugins.tools.diagnose` -- ``tpu_diagnose``.
* :mod:`~tpu_agent.plugins.tools.resources` -- resources and prompts.

To add a tool: write it as a module-level ``async`` function taking ``ctx: Context`` (for the server state),
arguments typed from :mod:`~.args`, returning a model from :mod:`tpu_agent.plugins.models`; add a
``ToolSpec`` to its module's ``TOOLS``; a new module goes into ``tpu_agent.plugins.server.TOOL_MODULES``.
"""
