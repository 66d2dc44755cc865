"""Where the rules send a reader: public documentation pages and the migration guide shipped in ``docs/``.

Every rule record cites some of these (``Rule.references``), so ``tpu-agent rules CODE``, the SARIF
``helpUri`` and the API lookup all point at pages a user can open. The guide
(``docs/torchtpu-migration.md``) explains each family in this project's words and links the TorchTPU
sources it rests on; a test checks that every section a rule cites exists.
"""

from __future__ import annotations

GUIDE = "docs/torchtpu-migration.md"

_PYTORCH = "https://docs.pytorch.org/docs/stable"
ACCELERATOR = f"{_PYTORCH}/accelerator.html"
DEVICE = f"{_PYTORCH}/tensor_attributes.html#torch-device"
RANDOM = f"{_PYTORCH}/random.html"
PROFILER = f"{_PYTORCH}/profiler.html"
AMP = f"{_PYTORCH}/amp.html"
DISTRIBUTED = f"{_PYTORCH}/distributed.html"
DDP = f"{_PYTORCH}/generated/torch.nn.parallel.DistributedDataParallel.html"
DEVICE_MESH = f"{_PYTORCH}/distributed.html#torch.distributed.device_mesh.init_device_mesh"
FSDP2 = f"{_PYTORCH}/distributed.fsdp.fully_shard.html"
TORCHRUN = f"{_PYTORCH}/elastic/run.html"
COMPILE = f"{_PYTORCH}/generated/torch.compile.html"
BACKENDS = f"{_PYTORCH}/backends.html"
MATMUL_PRECISION = f"{_PYTORCH}/generated/torch.set_float32_matmul_precision.html"
DATA = f"{_PYTORCH}/data.html"
CPP_EXTENSION = f"{_PYTORCH}/cpp_extension.html"
SDPA = f"{_PYTORCH}/generated/torch.nn.functional.scaled_dot_product_attention.html"
ENV_VARS = f"{_PYTORCH}/torch_environment_variables.html"
DETERMINISM = f"{_PYTORCH}/notes/randomness.html"
TORCH_TPU = "https://github.com/google-pytorch/torch_tpu"
TORCH_TPU_GUIDE = "https://torchtpu.readthedocs.io"  # TorchTPU's user guide, rendered from its notebooks


def torch_tpu_notebook(name: str) -> str:
    """One of TorchTPU's guide notebooks (``docs/notebooks/<name>.py``), e.g. ``torch_tpu_notebook("eager_mode")``."""
    return f"{TORCH_TPU}/blob/main/docs/notebooks/{name}.py"


CLOUD_TPU_PYTORCH = "https://docs.cloud.google.com/tpu/docs/pytorch-on-tpu"


def guide(section: str) -> str:
    """A section of the migration guide shipped with tpu-agent, e.g. ``guide("devices")``."""
    return f"{GUIDE}#{section}"
