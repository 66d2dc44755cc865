"""``python -m tpu_agent`` is the same program as the ``tpu-agent`` console script."""

from tpu_agent.cli import main

if __name__ == "__main__":
    main()
