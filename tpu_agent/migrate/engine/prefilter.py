r"""The cheap gate in front of the parser: a file with no CUDA-ish token is not parsed at all.

One compiled bytes regex, case-insensitive, run over the raw file; it is a superset of every rule's trigger
(``cuda`` also covers ``CUDA_VISIBLE_DEVICES``, ``.cuda()`` and ``torch.cuda``), so a miss proves there is
nothing to do.

Why the text is lower-cased rather than the regex compiled with ``re.IGNORECASE``: Python's ``re`` folds case
character by character in its inner loop, which makes the search four times slower on real files (it runs over
every file, and over every top-level statement in the gate). The two are the same test: a bytes pattern folds
only ASCII letters, exactly what ``bytes.lower()`` changes, and the pattern is written in lower case (a test
checks that), with no ``\S``/``\W``/``\D``/``\B`` escapes that lower-casing would turn into others.
"""

from __future__ import annotations

import re

CUDA_TOKENS = re.compile(
    rb"cuda|nccl|cudnn|cublas|tf32|triton|flash_attn|xformers|apex|bitsandbytes|cupy|deepspeed|nvtx|nvidia|nvcr|"
    rb"pynvml|gputil|gradscaler|load_inline|cpp_extension|load_library|torch\.compile|inductor|device_ids|nproc.per.node|dataparallel|syncbatchnorm|"
    # integer devices and process-group device ids (``.to(local_rank)``, ``device_id=device``)
    rb"device_id|\.to\(\s*(?:int\(\s*os\.environ|(?:\w+\.)*(?:local_?rank|rank|gpu|gpu_?id)\s*[,)])|device\(\s*(?:\w+\.)*(?:local_?rank|gpu)\s*\)|"
    rb"device\s*=\s*(?:\w+\.)*(?:local_?rank|rank|gpu|gpu_?id)\s*[,)]|"
    # device-agnostic code binding a rank's device or building it (TorchTPU binds one device per process)
    rb"set_device_i(?:ndex|dx)|current_accelerator\(\s*\)|"
    # the per-process device count checked against a world size (TPU216: 1 in every rank under TorchTPU)
    rb"accelerator\.device_count|"
    # dependency files: flash-attn, CUDA wheel builds and indexes
    rb"flash.attn|\+cu\d{2,3}|whl/cu\d|"
    # float16 casts (TPU304): bf16, not fp16, is the TPU's native type
    rb"(?<!b)float16|\.half\(\s*\)|halftensor|torch\.half\b|"
    # a device string built from a device type and a rank (``f"{device.type}:{args.gpu}"``: TPU107)
    rb"\}:\{(?:\w+\.)*(?:local_?rank|rank|gpu|gpu_?id)\}|"
    # porting pitfalls seen on TorchTPU (rules/field_pitfalls.py)
    rb"tpu\.set_device|all_to_all|view_as_complex|polar|antialias|torchvision|is_torch_tpu_available|"
    # Lightning's accelerator="gpu" (TPU109)
    rb"accelerator\s*=\s*[\"']gpu[\"']",
)


def lower_search(pattern: re.Pattern[bytes], data: bytes) -> re.Match[bytes] | None:
    """``pattern`` (written in lower case) searched case-insensitively in ``data``, as with ``re.IGNORECASE``."""
    return pattern.search(data.lower())


def may_need_migration(data: bytes) -> bool:
    return lower_search(CUDA_TOKENS, data) is not None
