"""A breadth tree for ``tpu-agent migrate``: files shaped like twelve kinds of public training repositories.

Each template below is written here, in this project's words, after the CUDA-specific shapes that kind of
repository has (no code is copied; the names say which kind of public code the shape was seen in):

* ``gpt_pretrain``: a nanoGPT-style single-file GPT pretraining script (config globals, DDP by env, autocast);
* ``speedrun``: a modded-nanogpt-style speedrun (combined backend string with ``device_id``, Triton kernel beside
  plain code, ``.to(device="cuda", non_blocking=True)``, compile flags, memory printouts);
* ``detector``: a YOLO/detectron-style detector trainer (``"nccl" if dist.is_nccl_available() else "gloo"``,
  ``select_device`` with CUDA_VISIBLE_DEVICES, ``.half()`` inference, device property printouts);
* ``diffusion``: a DiT/diffusers-style trainer and sampler (rank modulo device count, pipelines ``.to("cuda")``,
  seeded generators, xformers);
* ``ssl_vision``: a DINO/MAE-style self-supervised trainer (``init_distributed_mode`` with ``args.gpu``,
  SyncBatchNorm, ``.cuda(non_blocking=True)`` lists, GradScaler);
* ``lightning``: Lightning/Fabric scripts (``accelerator="gpu"``, precision, matmul precision);
* ``hf_trainer``: Hugging Face Trainer/accelerate scripts and tests (``device_map``, ``torch_dtype``, skip
  decorators, parametrised devices, device-map dicts);
* ``rl``: CleanRL/SB3-style RL (``args.cuda`` flags, ``torch.device("cuda" if ... and args.cuda else "cpu")``,
  deterministic cuDNN, ``as_tensor(..., device=...)``);
* ``classification``: torchvision-references-style classification (``args.dist_backend``, AMP autocast, EMA);
* ``timm_like``: a timm-style device setup (device-type tables, ``device.type == "cuda"`` guards);
* ``titan_like``: a torchtitan-style FSDP2/TP trainer (device meshes, a backend from the environment with a
  CPU-side gloo, NCCL env knobs);
* ``llm_inference``: a whisper/llama-inference-style script (fp16 on CUDA, ``torch.cuda.is_bf16_supported``,
  ``empty_cache``).

:func:`make_breadth_tree` writes them with ordinary code around (from :mod:`real_tree`'s plain snippets).
:func:`silent_references` counts what a plan neither converted nor reported: CUDA device literals, NCCL
backends, ``.cuda()`` and ``torch.cuda.*`` on lines without any finding, so the conversion share it feeds
(:func:`breadth_share`) cannot look better by staying silent.
"""

from __future__ import annotations

import io
import random
import re
import tokenize
from pathlib import Path
from typing import NamedTuple

from real_tree import PLAIN_SNIPPETS, conversion_share, counts_as_convertible

from tpu_agent.migrate.model import Plan

TEMPLATES: dict[str, str] = {
    "gpt_pretrain": '''"""GPT pretraining script {n}."""
import math
import os
import time
from contextlib import nullcontext

import numpy as np
import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

batch_size = 12
block_size = 1024
backend = "nccl"
device = "cuda"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
compile = True
ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{{ddp_local_rank}}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
else:
    master_process = True
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {{"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)


def get_batch(data):
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    if device_type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


def setup(model):
    model.to(device)
    scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
    if compile:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[ddp_local_rank])
    return model, scaler
''',
    "speedrun": '''"""Speedrun-style GPT training {n}."""
import os
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

torch._inductor.config.coordinate_descent_tuning = True
rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group(backend="cuda:nccl,cpu:gloo", device_id=device)
dist.barrier()
master_process = rank == 0


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)


def distributed_data_generator(tokens, batch_size):
    pos = 0
    while True:
        buf = tokens[pos + rank * batch_size :][: batch_size + 1]
        inputs = buf[:-1].to(device="cuda", dtype=torch.int32, non_blocking=True)
        targets = buf[1:].to(device="cuda", dtype=torch.int64, non_blocking=True)
        pos += batch_size * world_size
        yield inputs, targets


def report(step, t0):
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() // 1024 // 1024
    print(f"step:{{step}} time:{{elapsed:.1f}}s peak memory:{{peak}} MiB")
''',
    "detector": '''"""Detector training entry {n}."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
RANK = int(os.getenv("RANK", -1))


def select_device(device="", batch_size=0):
    cpu = device.lower() == "cpu"
    if cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    elif device:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    cuda = not cpu and torch.cuda.is_available()
    if cuda:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"CUDA:{{i}} ({{p.name}}, {{p.total_memory / (1 << 20):.0f}}MiB)")
        arg = "cuda:0"
    else:
        arg = "cpu"
    return torch.device(arg)


def init_ddp(opt):
    if LOCAL_RANK != -1:
        torch.cuda.set_device(LOCAL_RANK)
        device = torch.device("cuda", LOCAL_RANK)
        dist.init_process_group(
            backend="nccl" if dist.is_nccl_available() else "gloo", timeout=timedelta(seconds=10800)
        )
        return device
    return select_device(opt.device, batch_size=opt.batch_size)


def wrap(model, device, cuda):
    if cuda and RANK != -1:
        model = DDP(model, device_ids=[LOCAL_RANK], output_device=LOCAL_RANK)
    return model


def half_inference(model, im, device):
    half = device.type != "cpu"
    model.half() if half else model.float()
    im = torch.from_numpy(im).to(device)
    im = im.half() if half else im.float()
    mem = f"{{torch.cuda.memory_reserved() / 1e9 if torch.cuda.is_available() else 0:.3g}}G"
    return model(im), mem
''',
    "diffusion": '''"""Diffusion transformer training and sampling {n}."""
import argparse

import torch
import torch.distributed as dist
from diffusers import StableDiffusionPipeline
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args):
    assert torch.cuda.is_available(), "Training currently requires at least one GPU."
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = rank % torch.cuda.device_count()
    seed = args.global_seed * dist.get_world_size() + rank
    torch.manual_seed(seed)
    torch.cuda.set_device(device)
    model = build_model(args)
    ema = build_model(args).to(device)
    model = DDP(model.to(device), device_ids=[rank])
    state = torch.load(args.ckpt, map_location=lambda storage, loc: storage)
    model.module.load_state_dict(state)
    return model, ema


def sample(prompt):
    pipe = StableDiffusionPipeline.from_pretrained("model-id", torch_dtype=torch.float16)
    pipe = pipe.to("cuda")
    pipe.enable_xformers_memory_efficient_attention()
    generator = torch.Generator("cuda").manual_seed(0)
    return pipe(prompt, generator=generator).images[0]


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--global-seed", type=int, default=0)
    parser.add_argument("--device", type=str, default="cuda")
    return parser.parse_args()
''',
    "ssl_vision": '''"""Self-supervised pretraining utilities {n}."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    elif torch.cuda.is_available():
        args.rank, args.gpu, args.world_size = 0, 0, 1
    args.dist_backend = "nccl"
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(
        backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size, rank=args.rank
    )
    dist.barrier()


def build(args, student, teacher):
    if args.use_bn_in_head:
        student = nn.SyncBatchNorm.convert_sync_batchnorm(student)
    student, teacher = student.cuda(), teacher.cuda()
    student = nn.parallel.DistributedDataParallel(student, device_ids=[args.gpu])
    fp16_scaler = torch.cuda.amp.GradScaler() if args.use_fp16 else None
    return student, teacher, fp16_scaler


def train_one_epoch(student, loader, fp16_scaler):
    for images, _ in loader:
        images = [im.cuda(non_blocking=True) for im in images]
        with torch.cuda.amp.autocast(fp16_scaler is not None):
            loss = student(images).mean()
        fp16_scaler.scale(loss).backward()
    torch.cuda.synchronize()
''',
    "lightning": '''"""Lightning and Fabric entry points {n}."""
import lightning as L
import torch
from lightning.fabric import Fabric


def fit(model, data):
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")
    trainer = L.Trainer(accelerator="gpu", devices=2, precision="16-mixed", max_epochs=3)
    trainer.fit(model, data)


def fabric_loop(model, loader):
    fabric = Fabric(accelerator="cuda", devices=2, strategy="ddp", precision="bf16-mixed")
    fabric.launch()
    model, optimizer = fabric.setup(model, torch.optim.AdamW(model.parameters()))
    for batch in loader:
        loss = model(batch).mean()
        fabric.backward(loss)
        optimizer.step()
    fabric.print(f"max memory {{torch.cuda.max_memory_allocated() / 1e9:.2f}} GB")
''',
    "hf_trainer": '''"""Hugging Face fine-tuning script and its tests {n}."""
import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments


def load(name):
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16, device_map="cuda")
    return model


def train(model, dataset):
    accelerator = Accelerator(mixed_precision="fp16")
    args = TrainingArguments(output_dir="out", fp16=torch.cuda.is_available(), per_device_train_batch_size=8)
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    trainer.train()
    torch.cuda.empty_cache()
    return accelerator


@pytest.mark.skipif(not torch.cuda.is_available(), reason="test requires a GPU")
def test_generate_on_gpu():
    model = load("tiny")
    ids = torch.tensor([[1, 2, 3]], device="cuda")
    assert model.generate(ids).device.type == "cuda"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_forward(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU")
    model = AutoModelForCausalLM.from_pretrained("tiny").to(device)
    assert model(torch.ones(1, 4, dtype=torch.long, device=device)).logits.is_cuda == (device == "cuda")


def test_tied_weights_device_map():
    device_map = {{"transformer.wte": "cuda:0", "lm_head.weight": "cuda:0", "transformer.h": 0}}
    model = AutoModelForCausalLM.from_pretrained("tiny", device_map=device_map)
    assert model.lm_head.weight.device == torch.device("cuda:0")
''',
    "rl": '''"""PPO agent training {n}."""
import argparse
import random

import numpy as np
import torch
import torch.nn as nn


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--torch-deterministic", type=bool, default=True)
    parser.add_argument("--cuda", type=bool, default=True, help="if toggled, cuda will be enabled by default")
    return parser.parse_args()


def setup(args):
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    return device


class Policy(nn.Module):
    def __init__(self, obs_dim, act_dim, device="cuda"):
        super().__init__()
        self.device = device
        self.net = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, act_dim)).to(device)

    def act(self, obs):
        obs = torch.as_tensor(obs, device=self.device, dtype=torch.float32)
        return self.net(obs)
''',
    "classification": '''"""Image classification reference training {n}."""
import os

import torch
import torch.distributed as dist


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    else:
        args.distributed = False
        return
    args.distributed = True
    torch.cuda.set_device(args.gpu)
    args.dist_backend = "nccl"
    dist.init_process_group(
        backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size, rank=args.rank
    )


def train_one_epoch(model, criterion, optimizer, loader, device, scaler=None):
    for image, target in loader:
        image, target = image.to(device), target.to(device)
        with torch.cuda.amp.autocast(enabled=scaler is not None):
            loss = criterion(model(image), target)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


def main(args):
    init_distributed_mode(args)
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    scaler = torch.cuda.amp.GradScaler() if args.amp else None
    model = build(args).to(device)
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    return model, scaler
''',
    "timm_like": '''"""Device and distributed setup in a vision model library {n}."""
import os

import torch


def init_distributed_device_so(device="cuda", dist_backend=None, dist_url=None):
    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    device_type, *device_idx = device.split(":", maxsplit=1)
    if distributed:
        if dist_backend is None:
            dist_backends = {{"xpu": "ccl", "hpu": "hccl", "cuda": "nccl", "npu": "hccl"}}
            dist_backend = dist_backends.get(device_type, "gloo")
        torch.distributed.init_process_group(backend=dist_backend, init_method=dist_url or "env://")
    return device_type


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "npu":
        torch.npu.synchronize()


def memory_summary(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 1e9
    return 0.0
''',
    "titan_like": '''"""Parallel training setup for large models {n}."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def init_distributed(enable_cpu_backend=True):
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    os.environ["NCCL_DEBUG"] = "WARN"
    backend = os.environ.get("DIST_BACKEND", "nccl")
    if enable_cpu_backend:
        dist.init_process_group(backend="cuda:nccl,cpu:gloo")
    else:
        dist.init_process_group(backend=backend)
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return local_rank


def build_mesh(dp, tp):
    return init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))


def shard(model, mesh):
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    stats = torch.cuda.memory_stats()
    return model, stats.get("allocated_bytes.all.peak", 0)
''',
    "llm_inference": '''"""Speech/LLM inference script {n}."""
import torch


def load_model(name, device=None):
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    model = build(name).to(device=device, dtype=dtype)
    return model, device


def transcribe(model, audio, device):
    with torch.inference_mode():
        mel = torch.from_numpy(audio).to(device)
        out = model(mel)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out
''',
    "tutorial": '''"""A tutorial-style script with the device idioms of many examples {n}."""
import argparse
import os

import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
os.environ["CUDA_LAUNCH_BLOCKING"] = "1"


def get_device(args):
    use_gpu = args.gpu and not args.no_cuda
    return torch.device("cuda:0" if use_gpu else "cpu")


def prepare(model, args):
    if args.device == "cuda" and torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model = model.to(memory_format=torch.channels_last).cuda()
    if "cuda" in str(args.device) and torch.cuda.get_device_capability()[0] >= 8:
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.cuda.manual_seed(args.seed)
    return model


def evaluate(model, loader, rank):
    checkpoint = torch.load("best.pt", map_location=f"cuda:{{torch.cuda.current_device()}}")
    model.load_state_dict(checkpoint)
    total = torch.zeros(1).cuda()
    for x, y in loader:
        x = x.to("cuda:%d" % rank)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            total += (model(x).argmax(1) == y.cuda()).sum()
    torch.distributed.all_reduce(total)
    return total.item()


def legacy(x):
    torch.set_default_tensor_type(torch.cuda.FloatTensor)
    return x.type(torch.cuda.FloatTensor)
''',
}
KINDS = tuple(TEMPLATES)


# The default size: issue 28's timing target is set for 440k lines, so the tree has at least that many (1,807 files,
# 442,344 lines) and the benchmark times the target itself, with no extrapolation.
COPIES = 139
FILLER_LINES = 200


def make_breadth_tree(root: Path, copies: int = COPIES, filler_lines: int = FILLER_LINES, seed: int = 0) -> Path:
    """Write ``copies`` files of every kind under ``root/<kind>/``, each with about ``filler_lines`` lines of
    ordinary code after the template (the shape real modules have), and return ``root``."""
    rng = random.Random(seed)
    for kind, template in TEMPLATES.items():
        directory = root / kind
        directory.mkdir(parents=True, exist_ok=True)
        for n in range(copies):
            parts = [template.format(n=n)]
            lines = parts[0].count("\n")
            k = 0
            while lines < parts[0].count("\n") + filler_lines:
                text = rng.choice(PLAIN_SNIPPETS).format(n=k)
                parts.append(text)
                lines += text.count("\n")
                k += 1
            (directory / f"{kind}_{n}.py").write_text("".join(parts), encoding="utf-8")
    return root


_DEVICE_LITERAL = re.compile(r"cuda(?::\d+)?")
_BACKEND_LITERAL = re.compile(r"(?:\w+:\w+,)*(?:cuda:)?nccl(?:,\w+:\w+)*")


def _cuda_tokens(source: str) -> list[int]:
    """Lines of the CUDA references in ``source``: device and backend literals, ``.cuda(`` and ``torch.cuda.``.

    Not counted: imports (an import left unused by the rewrites is removed with them), the choices of a
    ``Literal[...]`` annotation, and ``args.cuda``-style flags (an attribute named cuda that is not called)."""
    lines: list[int] = []
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type != tokenize.COMMENT]
    statement_head = ""
    literal_depth = 0  # brackets open inside a Literal[...] annotation
    for i, token in enumerate(tokens):
        if token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            statement_head = "" if token.type == tokenize.NEWLINE else statement_head
            continue
        statement_head = statement_head or token.string
        if statement_head in ("import", "from"):
            continue
        if literal_depth or (token.string == "[" and i > 0 and tokens[i - 1].string == "Literal"):
            literal_depth += {"[": 1, "]": -1}.get(token.string, 0)
            continue
        if token.type == tokenize.STRING and token.string[:1] in "\"'":
            text = token.string.strip("\"'")
            if _DEVICE_LITERAL.fullmatch(text) or _BACKEND_LITERAL.fullmatch(text):
                lines.append(token.start[0])
        elif token.type == tokenize.NAME and token.string == "cuda" and i > 1 and tokens[i - 1].string == ".":
            called = i + 1 < len(tokens) and tokens[i + 1].string == "("
            if called or tokens[i - 2].string == "torch":
                lines.append(token.start[0])
    return lines


class Silent(NamedTuple):
    references: int  # CUDA references on lines no finding covers
    files: int  # files holding at least one


def silent_lines(plan: Plan) -> dict[str, list[tuple[int, str]]]:
    """Per Python file of the plan (by display path), the CUDA references no finding (fixed or not) covers: their
    line numbers and texts, one entry per reference."""
    out: dict[str, list[tuple[int, str]]] = {}
    for result in plan.files:
        if result.path.suffix != ".py" or result.skipped_reason is not None:
            continue
        covered = {line for f in result.findings for line in range(f.line, (f.end_line or f.line) + 1)}
        source = result.path.read_text(encoding="utf-8")
        texts = source.splitlines()
        missed = [(line, texts[line - 1].strip()) for line in _cuda_tokens(source) if line not in covered]
        if missed:
            out[result.display_path] = missed
    return out


def silent_references(plan: Plan) -> Silent:
    """CUDA references in the plan's Python files that no finding (fixed or not) covers: missed silently."""
    lines = silent_lines(plan)
    return Silent(sum(len(missed) for missed in lines.values()), len(lines))


def misses(plan: Plan) -> dict[tuple[str, str], list[str]]:
    """What the share counts as not converted, grouped by (rule code, or SILENT, and the message or line text up to
    its first colon or 60 characters), each with its ``path:line`` places: findings with a TorchTPU form that
    were not fixed, and silently missed references."""
    groups: dict[tuple[str, str], list[str]] = {}
    for finding in plan.findings:
        if not finding.fixed and counts_as_convertible(finding):
            key = (finding.code, re.sub(r"`[^`]*`", "`...`", finding.message).split(":")[0][:60])
            groups.setdefault(key, []).append(f"{finding.path}:{finding.line}")
    for path, missed in silent_lines(plan).items():
        for line, text in missed:
            groups.setdefault(("SILENT", text[:60]), []).append(f"{path}:{line}")
    return groups


class BreadthShare(NamedTuple):
    converted: int
    convertible: int  # references with a TorchTPU form, the silent ones included
    silent: Silent
    skipped_internal: int  # files skipped by an internal error
    internal_findings: int  # edits dropped by an internal error in one rule

    @property
    def share(self) -> float:
        return self.converted / self.convertible if self.convertible else 1.0


def breadth_share(plan: Plan) -> BreadthShare:
    """:func:`real_tree.conversion_share`, with every silently missed reference counted as not converted."""
    share = conversion_share(plan)
    silent = silent_references(plan)
    skipped = sum(1 for f in plan.files if f.skipped_reason and "internal error" in f.skipped_reason)
    internal = sum(1 for f in plan.findings if "internal error" in f.message)
    return BreadthShare(share.converted, share.convertible + silent.references, silent, skipped, internal)
