"""Every bound the MCP server puts on what an agent may send or start, defined once.

The tool schemas publish these as ``maxLength``/``maxItems``/``maximum`` so a client can see them, the
server refuses anything larger as ``invalid-argument`` before a tool runs, and the job manager enforces
the resource bounds (concurrent jobs, ranks per job). Text that came from the caller is echoed back only
:func:`tpu_agent.errors.clipped`, so an oversized id or path never returns whole in an error message.
"""

from __future__ import annotations

#: Longest path a tool accepts (Linux ``PATH_MAX``); longer ones cannot name a file anyway.
MAX_PATH_CHARS = 4096
#: Paths one scan or plan call may name.
MAX_PATHS = 200
#: Script arguments a job passes on, and the length of each.
MAX_SCRIPT_ARGS = 200
MAX_SCRIPT_ARG_CHARS = 4096
#: Plan and job ids are short generated tokens; nothing longer can be one.
MAX_ID_CHARS = 64
#: Rule codes (``TPU101``) and prefixes, and how many one call may select or ignore.
MAX_RULE_CODE_CHARS = 16
MAX_RULE_CODES = 100
#: A chip spelling such as ``v5e`` or ``v5p-128``.
MAX_CHIP_CHARS = 16
#: A free-text API lookup.
MAX_QUERY_CHARS = 200

#: Jobs (runs and profiles) one server runs at a time; ``tpu-agent mcp --max-jobs`` changes it.
DEFAULT_MAX_JOBS = 2
#: Ranks (processes) one job may start; ``tpu-agent mcp --max-ranks`` changes it, up to :data:`MAX_RANKS`.
DEFAULT_MAX_RANKS = 8
MAX_RANKS = 64
#: Finished jobs the server remembers for tpu_job_status; older ones are forgotten first.
MAX_FINISHED_JOBS = 100


__all__ = [
    "DEFAULT_MAX_JOBS",
    "DEFAULT_MAX_RANKS",
    "MAX_CHIP_CHARS",
    "MAX_FINISHED_JOBS",
    "MAX_ID_CHARS",
    "MAX_PATHS",
    "MAX_PATH_CHARS",
    "MAX_QUERY_CHARS",
    "MAX_RANKS",
    "MAX_RULE_CODES",
    "MAX_RULE_CODE_CHARS",
    "MAX_SCRIPT_ARGS",
    "MAX_SCRIPT_ARG_CHARS",
]
