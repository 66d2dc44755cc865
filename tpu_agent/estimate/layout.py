"""Where an estimate run's files and settings live, shared by the launcher and the capture hook.

Its own module, free of torch: the launcher (``tpu-agent estimate``, ``profile --tpu-compiler``) only starts
the script and reads the result, and must not pay torch's import for four names the hook also needs (as
``profile/layout.py`` does for profile).
"""

from __future__ import annotations

ESTIMATE_DIR_ENV = "TPU_AGENT_ESTIMATE_DIR"  # the run's directory, read by the hook in the script's process
HOOK_SPEC = "tpu_agent.estimate.capture:install"  # what TPU_AGENT_HOOKS names in the script's process
OPTIONS_FILE = "options.json"
RESULT_FILE = "estimate.json"
