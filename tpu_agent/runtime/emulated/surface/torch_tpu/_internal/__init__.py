"""``torch_tpu._internal``: the modules TorchTPU's guides import (execution_mode, sync, utils, profiler)."""
