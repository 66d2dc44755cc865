"""``python -m tpu_agent.runtime [OPTIONS] SCRIPT [ARGS...]`` is ``tpu-agent run`` under another name."""

import sys

from tpu_agent.cli import main

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "run", *sys.argv[1:]]
    main()
