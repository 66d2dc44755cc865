"""Each rank prints its pid, then sleeps: the launcher's Ctrl-C and timeout handling must stop them all."""

import os
import time

print(f"ready rank={os.environ['RANK']} pid={os.getpid()}", flush=True)
time.sleep(120)
