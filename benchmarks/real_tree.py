"""A broad, real-shaped CUDA training tree for measuring ``tpu-agent migrate``: conversion share and speed.

The snippets are the shapes public PyTorch training code has (pytorch/examples, torchvision references,
nanoGPT-style scripts, HF-style trainers, detection/segmentation research code, Lightning-like frameworks),
written out here so nothing is downloaded: device selection in every spelling, integer devices, DDP setup
through config objects and argparse, AMP, memory/timing calls, NCCL settings, legacy tensor types, cuDNN
flags, attention kernels, and the parts no rewrite can port (Triton kernels, flash-attn, CUDA extensions,
RNG state). Around them: long stretches of ordinary model, data and utility code, as real files have. Four
file shapes: tutorial scripts, research modules, framework modules (long, few CUDA references) and plain
utilities, plus launch scripts, YAML configs and requirements files.

``make_tree(root, files=1700, mean_lines=260)`` writes about 440k lines. Used by ``migrate_bench.py
--real-tree`` and by tests/migrate/test_real_tree.py (a small tree).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import NamedTuple

from tpu_agent.migrate.model import Finding, Plan, Safety
from tpu_agent.migrate.rules import ALL_RULES

# ---- CUDA-specific snippets, each as it appears in public code ({n} keeps names unique) ------------------
CUDA_SNIPPETS = [
    # tutorials: device selection
    """
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model_{n} = Net().to(device)
""",
    """
use_cuda = not args.no_cuda and torch.cuda.is_available()
device_{n} = torch.device("cuda" if use_cuda else "cpu")
kwargs_{n} = {{"num_workers": 1, "pin_memory": True}} if use_cuda else {{}}
""",
    """
def to_device_{n}(batch):
    images, targets = batch
    return images.cuda(non_blocking=True), targets.cuda(non_blocking=True)
""",
    """
def evaluate_{n}(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to("cuda"), target.to("cuda")
            output = model(data)
            correct += output.argmax(dim=1).eq(target).sum().item()
    return correct / len(loader.dataset)
""",
    # research code: integer devices and DDP
    """
def setup_ddp_{n}(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    model = Net().to(rank)
    ddp_model = DDP(model, device_ids=[rank])
    return ddp_model
""",
    """
def init_distributed_mode_{n}(args):
    args.rank = int(os.environ["RANK"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    args.dist_backend = "nccl"
    print(f"| distributed init (rank {{args.rank}}): {{args.dist_url}}", flush=True)
    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                            world_size=args.world_size, rank=args.rank)
    dist.barrier(device_ids=[args.gpu])
""",
    """
def build_model_{n}(args, model):
    model.cuda(args.gpu)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu], output_device=args.gpu)
    checkpoint = torch.load(args.resume, map_location=lambda storage, loc: storage.cuda(args.gpu))
    model.load_state_dict(checkpoint["model"])
    return model
""",
    """
local_rank_{n} = int(os.environ.get("LOCAL_RANK", 0))
backend_{n} = "gloo" if not torch.cuda.is_available() else "nccl"
dist.init_process_group(backend=backend_{n}, device_id=torch.device("cuda", local_rank_{n}))
""",
    # nanoGPT-style config globals
    """
device = "cuda"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {{"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}}[dtype]
ctx_{n} = torch.amp.autocast(device_type=device_type, dtype=ptdtype)
""",
    # AMP
    """
def train_one_epoch_{n}(model, loader, optimizer, scaler):
    for images, labels in loader:
        images, labels = images.cuda(), labels.cuda()
        with torch.cuda.amp.autocast():
            loss = criterion(model(images), labels)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
""",
    """
scaler_{n} = torch.cuda.amp.GradScaler(enabled=args.amp)
""",
    # timing and memory
    """
def benchmark_{n}(model, x, iters=50):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        model(x)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters
""",
    """
def log_memory_{n}(step):
    mem = torch.cuda.max_memory_allocated() / 1024**3
    reserved = torch.cuda.memory_reserved() / 1024**3
    print(f"step {{step}}: max allocated {{mem:.2f}} GiB, reserved {{reserved:.2f}} GiB")
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.empty_cache()
""",
    # seeding and flags
    """
def set_seed_{n}(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
""",
    """
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
""",
    # device queries
    """
n_gpus_{n} = torch.cuda.device_count()
if n_gpus_{n} >= 2:
    print(f"using {{n_gpus_{n}}} GPUs: {{torch.cuda.get_device_name(0)}}")
current_{n} = torch.cuda.current_device()
""",
    # checks on tensors
    """
def maybe_pin_{n}(t):
    if t.is_cuda:
        return t
    return t.pin_memory().cuda(non_blocking=True)
""",
    """
def same_device_{n}(a, b):
    if a.device.type == "cuda" and b.device.type != "cuda":
        b = b.to(a.device)
    return a, b
""",
    # loaders and zeros on the device
    """
def make_buffers_{n}(batch_size, dim):
    mask = torch.zeros(batch_size, dim, device="cuda")
    pos = torch.arange(dim, device="cuda:0")
    return mask, pos
""",
    """
loader_{n} = torch.utils.data.DataLoader(dataset, batch_size=64, pin_memory=True, pin_memory_device="cuda")
""",
    # legacy
    """
def legacy_anchors_{n}(n_anchors):
    anchors = torch.cuda.FloatTensor(n_anchors, 4).zero_()
    ids = torch.cuda.LongTensor([0, 1, 2])
    return anchors, ids
""",
    # attention kernels and streams
    """
def attention_{n}(q, k, v):
    with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=True, enable_mem_efficient=True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
""",
    """
class Prefetcher{n}:
    def __init__(self, loader):
        self.loader = iter(loader)
        self.stream = torch.cuda.Stream()

    def next(self):
        batch = next(self.loader)
        with torch.cuda.stream(self.stream):
            batch = batch.cuda(non_blocking=True)
        torch.cuda.current_stream().wait_stream(self.stream)
        return batch
""",
    # env and NCCL settings
    """
os.environ["NCCL_DEBUG"] = "INFO"
os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus
os.environ.update({{"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "8"}})
""",
    # profiler
    """
def profile_{n}(model, x):
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        model(x)
    return prof
""",
    # what no rewrite can port (manual by design)
    """
import triton
import triton.language as tl


@triton.jit
def add_kernel_{n}(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)
""",
    """
try:
    from flash_attn import flash_attn_func
except ImportError:
    flash_attn_func = None
""",
    """
def save_rng_{n}():
    return {{"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state()}}
""",
    """
model_dp_{n} = nn.DataParallel(model)
""",
    # the config-object pattern
    """
@dataclass
class TrainerConfig{n}:
    device: str = "cuda"
    backend: str = "nccl"
    precision: str = "bf16"
""",
    """
def get_args_{n}():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", help="cuda or cpu")
    parser.add_argument("--dist-backend", default="nccl", type=str)
    parser.add_argument("--local_rank", type=int, default=0)
    return parser.parse_args()
""",
]

# ---- ordinary code (no CUDA token): models, data, metrics, utilities -------------------------------------
PLAIN_SNIPPETS = [
    '''

class ResidualBlock{n}(nn.Module):
    """Two 3x3 convolutions with a skip connection."""

    def __init__(self, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.act(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act(out + x)
''',
    """

class MLP{n}(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.fc2(F.gelu(self.fc1(x))))
""",
    '''

def accuracy_{n}(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k."""
    maxk = max(topk)
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    res = []
    for k in topk:
        correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
        res.append(correct_k.mul_(100.0 / batch_size))
    return res
''',
    '''

class AverageMeter{n}:
    """Computes and stores the average and current value."""

    def __init__(self, name: str, fmt: str = ":f") -> None:
        self.name = name
        self.fmt = fmt
        self.reset()

    def reset(self) -> None:
        self.val = 0.0
        self.avg = 0.0
        self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self) -> str:
        fmtstr = "{{name}} {{val" + self.fmt + "}} ({{avg" + self.fmt + "}})"
        return fmtstr.format(**self.__dict__)
''',
    """

class TextDataset{n}(torch.utils.data.Dataset):
    def __init__(self, tokens, block_size: int) -> None:
        self.tokens = tokens
        self.block_size = block_size

    def __len__(self) -> int:
        return max(0, len(self.tokens) - self.block_size - 1)

    def __getitem__(self, idx: int):
        chunk = self.tokens[idx : idx + self.block_size + 1]
        x = torch.tensor(chunk[:-1], dtype=torch.long)
        y = torch.tensor(chunk[1:], dtype=torch.long)
        return x, y
""",
    """

def cosine_lr_{n}(step: int, warmup: int, total: int, base_lr: float, min_lr: float = 0.0) -> float:
    if step < warmup:
        return base_lr * step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
""",
    """

def save_checkpoint_{n}(state: dict, is_best: bool, path: str = "checkpoint.pth.tar") -> None:
    torch.save(state, path)
    if is_best:
        shutil.copyfile(path, "model_best.pth.tar")
    logger.info("saved checkpoint to %s (best: %s)", path, is_best)
""",
    """

class CausalSelfAttention{n}(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)
""",
    '''

def collate_{n}(batch):
    """Pads variable-length sequences to the longest one in the batch."""
    lengths = [len(item["input_ids"]) for item in batch]
    longest = max(lengths)
    input_ids = torch.full((len(batch), longest), fill_value=0, dtype=torch.long)
    attention = torch.zeros((len(batch), longest), dtype=torch.long)
    for i, item in enumerate(batch):
        input_ids[i, : lengths[i]] = torch.tensor(item["input_ids"])
        attention[i, : lengths[i]] = 1
    return {{"input_ids": input_ids, "attention_mask": attention}}
''',
    '''

def parse_config_file_{n}(path: str) -> dict:
    """Reads key = value lines; '#' starts a comment."""
    values = {{}}
    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values
''',
]

HEADER = '''"""{doc}"""

import argparse
import math
import os
import random
import shutil
import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

logger = logging.getLogger(__name__)
'''
PLAIN_HEADER = '''"""{doc}"""

import math
import os
import shutil
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

logger = logging.getLogger(__name__)
'''

# file shape -> (share of files, CUDA snippets per 1000 lines, mean-lines factor)
SHAPES = {
    "tutorial": (0.15, 24.0, 0.8),
    "research": (0.35, 8.0, 1.0),
    "framework": (0.20, 2.0, 2.2),
    "plain": (0.30, 0.0, 0.7),
}

LAUNCH = """#!/usr/bin/env bash
export CUDA_VISIBLE_DEVICES=0,1,2,3
export NCCL_DEBUG=INFO
export NCCL_IB_DISABLE=1
torchrun --nproc_per_node=gpu train.py --device cuda --dist-backend nccl "$@"
"""
CONFIG = """model:
  name: resnet50
  pretrained: false
train:
  device: cuda
  backend: nccl
  batch_size: 256
  lr: 0.1
"""
REQUIREMENTS = """--extra-index-url https://download.pytorch.org/whl/cu121
torch==2.3.1+cu121
torchvision==0.18.1+cu121
numpy>=1.24
flash-attn>=2.5.0
tqdm
"""


def make_python(index: int, shape: str, mean_lines: int, rng: random.Random) -> str:
    _, density, factor = SHAPES[shape]
    target = max(40, int(rng.gauss(mean_lines * factor, mean_lines * factor / 4)))
    doc = f"{shape} module {index}"
    parts = [(PLAIN_HEADER if shape == "plain" else HEADER).format(doc=doc)]
    lines = parts[0].count("\n")
    n = 0
    budget = density / 1000.0
    while lines < target:
        if shape != "plain" and rng.random() < budget * 30:
            block = rng.choice(CUDA_SNIPPETS)
        else:
            block = rng.choice(PLAIN_SNIPPETS)
        text = block.format(n=n)
        parts.append(text)
        lines += text.count("\n")
        n += 1
    return "".join(parts)


def make_tree(root: Path, files: int = 1_700, mean_lines: int = 260, seed: int = 0) -> Path:
    """Write the tree under ``root`` (a few repositories' worth of packages) and return ``root``."""
    rng = random.Random(seed)
    shapes = list(SHAPES)
    weights = [SHAPES[s][0] for s in shapes]
    repos = max(1, files // 120)
    for index in range(files):
        repo = root / f"repo{index % repos}"
        if index < repos:
            repo.mkdir(parents=True, exist_ok=True)
            (repo / "launch.sh").write_text(LAUNCH)
            (repo / "config.yaml").write_text(CONFIG)
            (repo / "requirements.txt").write_text(REQUIREMENTS)
        shape = rng.choices(shapes, weights)[0]
        directory = repo / shape / f"pkg{index % 7}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"mod_{index}.py").write_text(make_python(index, shape, mean_lines, rng), encoding="utf-8")
    return root


class Share(NamedTuple):
    """How much of a plan's CUDA references the migration converts.

    A reference *has a TorchTPU form* (``convertible``) when its rule can rewrite it: safe rewrites and
    unsafe ones alike. An unsafe rewrite still is a form: without ``--unsafe-fixes`` it is ``held_back`` by
    the user's choice and counts against ``share``; it is not dropped from the denominator. A reference has
    no form when its rule is MANUAL (Triton, flash-attn, RNG state, DataParallel...) or the rule reported it
    as not rewritable (its message says "not rewritten" and why: no equivalent in this torch).
    """

    references: int
    converted: int
    convertible: int
    held_back: int  # unsafe rewrites not applied because --unsafe-fixes is off
    left: dict[str, int]  # unconverted references per rule code

    @property
    def share(self) -> float:
        return self.converted / self.convertible if self.convertible else 1.0


def counts_as_convertible(finding: Finding) -> bool:
    """Whether the share counts ``finding`` as a reference with a TorchTPU form: fixed, or held back as unsafe, or
    reported as fixable by a rule that is not manual by design."""
    if ALL_RULES[finding.code].safety is Safety.MANUAL:
        return False
    return finding.fixed or finding.safety is Safety.UNSAFE or "not rewritten" not in finding.message


def conversion_share(plan: Plan) -> Share:
    """The :class:`Share` of ``plan`` under the options it was made with."""
    references = converted = convertible = held_back = 0
    left: dict[str, int] = {}
    for finding in plan.findings:
        references += 1
        converted += finding.fixed
        if counts_as_convertible(finding):
            convertible += 1
            held_back += not finding.fixed and finding.safety is Safety.UNSAFE
        if not finding.fixed:
            left[finding.code] = left.get(finding.code, 0) + 1
    return Share(references, converted, convertible, held_back, left)
