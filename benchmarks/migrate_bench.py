"""Throughput of ``tpu_agent.migrate.api.plan`` on a synthetic repository.

Generates a corpus in a temporary directory (default 2,400 files, about 360k lines; a quarter of the
files use CUDA-specific PyTorch, the rest is plain Python with no CUDA token), then plans the CUDA part
and the plain part separately, once with one worker and once with one worker per core, and prints
files/s and lines/s side by side, with per-core figures.

Targets (ISSUE 2): 3,000 lines/s per core for files that are parsed, 50,000 lines/s for files the
prefilter dismisses. Run:

    .venv/bin/python benchmarks/migrate_bench.py [--files 2400] [--lines 150] [--cuda-share 0.25] [--jobs N]

``--real-tree`` instead writes the real-shaped tree of ``benchmarks/real_tree.py`` (default 1,700 files,
about 440k lines; issue 13's target: the in-place run in <= 30 s on 2 cores with the default jobs) and
migrates it in place as the CLI does (plan, then apply), printing the wall time next to the time the
value-flow analysis took inside it (measured on the same files in the same run), and the share of
converted CUDA references: over all references, and over those that have a TorchTPU / torch.accelerator
form (manual-by-design rules excluded), with and without ``--unsafe-fixes`` and for both targets (on a quarter
of the tree).

``--breadth`` writes the breadth tree of ``benchmarks/breadth_tree.py`` (files shaped like thirteen kinds of public
training repositories, 442k lines by default; issue 28's targets: >= 95 % converted counting the references
no finding covers as missed, 0 files skipped by an internal error, <= 30 s in place on 2 cores) and prints, per
target, the share, what is left by rule, skipped files and dropped edits; then the timed in-place run, a check
that every output parses and a second run changes nothing, and TorchFix's time on a copy of the same tree
(``--torchfix PATH``, default ``torchfix`` on PATH; install it in a separate environment: it pins an older libcst).

``--repos DIR...`` measures checked-out repositories the same way as ``--breadth`` (one directory each; they are
copied, never changed): per repository and in total, per target, the converted share of the references with a
TorchTPU form (silent misses counted as not converted), files skipped (by an internal error) and what is left by
rule (``--misses N``: the N largest groups of misses per target, by rule and message, with places); then, on the
copies, the in-place run with the default settings, outputs that do not parse and what a second run still changes;
then TorchFix beside tpu-agent on fresh copies of the same repositories, one worker each, in CPU seconds.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from breadth_tree import COPIES, FILLER_LINES, breadth_share, make_breadth_tree, misses
from real_tree import conversion_share, make_tree

from tpu_agent.migrate import api
from tpu_agent.migrate.analysis.valueflow import analyse
from tpu_agent.migrate.model import MigrateOptions, Plan, Target

PARSED_TARGET_PER_CORE = 3_000  # lines/s
PREFILTER_TARGET = 50_000  # lines/s

HEADER = '"""Module {index}: synthetic code for the migrate benchmark."""\n\nfrom __future__ import annotations\n\nimport math\nimport os\n'

# Plain blocks: ordinary Python a repository is mostly made of (no CUDA-ish token anywhere).
PLAIN_BLOCKS = [
    '''

def moving_average_{n}(values: list[float], window: int = 5) -> list[float]:
    """Average of each window of values."""
    out = []
    for i in range(len(values) - window + 1):
        chunk = values[i : i + window]
        out.append(sum(chunk) / window)
    return out
''',
    '''

class Config{n}:
    """Settings read from the environment."""

    def __init__(self, prefix: str = "APP") -> None:
        self.prefix = prefix
        self.values = {{k: v for k, v in os.environ.items() if k.startswith(prefix)}}

    def get(self, key: str, default: str = "") -> str:
        return self.values.get(f"{{self.prefix}}_{{key}}", default)

    def __repr__(self) -> str:
        return f"Config{n}({{self.prefix!r}}, {{len(self.values)}} values)"
''',
    """

def parse_line_{n}(line: str) -> tuple[str, float] | None:
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    name, _, value = line.partition("=")
    try:
        return name.strip(), float(value)
    except ValueError:
        return None
""",
    """

def schedule_{n}(step: int, warmup: int = 100, total: int = 10_000) -> float:
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
""",
]

# CUDA blocks: the patterns the rules rewrite or flag (devices, torch.cuda API, AMP, NCCL, cuDNN flags).
CUDA_BLOCKS = [
    """

def train_step_{n}(model, batch, optimizer, scaler):
    inputs = batch["x"].cuda(non_blocking=True)
    labels = batch["y"].to("cuda")
    with torch.cuda.amp.autocast():
        loss = model(inputs).sub(labels).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.cuda.synchronize()
    return loss.item()
""",
    """

def setup_{n}(rank: int, world_size: int):
    torch.cuda.set_device(rank)
    torch.distributed.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.backends.cudnn.benchmark = True
    device = torch.device(f"cuda:{{rank}}")
    return device
""",
    """

def report_memory_{n}():
    if torch.cuda.is_available():
        used = torch.cuda.memory_allocated() / 2**20
        peak = torch.cuda.max_memory_allocated() / 2**20
        print(f"memory {{used:.1f}} MiB (peak {{peak:.1f}} MiB) on {{torch.cuda.device_count()}} devices")
    torch.cuda.empty_cache()
""",
]


def make_file(index: int, lines: int, cuda: bool, rng: random.Random) -> str:
    """About ``lines`` lines of Python; CUDA files mix one CUDA block in per few plain ones."""
    parts = [HEADER.format(index=index)]
    if cuda:
        parts.append("import torch\n")
    n = 0
    while sum(p.count("\n") for p in parts) < lines:
        pool = CUDA_BLOCKS if cuda and n % 4 == 1 else PLAIN_BLOCKS
        parts.append(rng.choice(pool).format(n=n))
        n += 1
    return "".join(parts)


def make_corpus(root: Path, files: int, lines: int, cuda_share: float, seed: int = 0) -> tuple[Path, Path]:
    """Write the corpus as ``root/cuda`` and ``root/plain``, nested a few packages deep like a repository."""
    rng = random.Random(seed)
    cuda_count = round(files * cuda_share)
    for index in range(files):
        cuda = index < cuda_count
        directory = root / ("cuda" if cuda else "plain") / f"pkg{index % 17}" / f"sub{index % 5}"
        directory.mkdir(parents=True, exist_ok=True)
        size = max(20, int(rng.gauss(lines, lines / 4)))
        (directory / f"mod_{index}.py").write_text(make_file(index, size, cuda, rng), encoding="utf-8")
    return root / "cuda", root / "plain"


@dataclass
class Measurement:
    label: str
    jobs: int
    files: int
    lines: int
    parsed: int
    prefiltered: int
    changed: int
    seconds: float
    cpu_seconds: float  # this process and its reaped workers: robust when other work shares the cores

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds

    @property
    def lines_per_s(self) -> float:
        return self.lines / self.seconds

    @property
    def cpu_rate(self) -> float:
        """Lines per CPU second; meaningful with one worker only (live worker processes are not counted)."""
        return self.lines / self.cpu_seconds


def cpu_seconds() -> float:
    """User + system CPU time of this process and of the worker processes it has reaped."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def measure(label: str, root: Path, jobs: int) -> Measurement:
    start, start_cpu = time.perf_counter(), cpu_seconds()
    plan: Plan = api.plan([root], MigrateOptions(jobs=jobs))
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - start_cpu
    return Measurement(
        label=label,
        jobs=jobs,
        files=len(plan.files),
        lines=sum(f.lines for f in plan.files),
        parsed=sum(1 for f in plan.files if not f.prefiltered and f.skipped_reason is None),
        prefiltered=sum(1 for f in plan.files if f.prefiltered),
        changed=len(plan.changed_files),
        seconds=seconds,
        cpu_seconds=cpu,
    )


def real_tree(files: int, lines: int) -> None:
    """Migrate the real-shaped tree in place (default jobs), then report speed and conversion shares."""
    workdir = Path(tempfile.mkdtemp(prefix="tpu-agent-migrate-real-"))
    try:
        root = make_tree(workdir / "tree", files=files, mean_lines=lines)
        # CPU cost first, in this process with one worker (pool workers' CPU time is not visible to us: under a
        # forkserver they are not our children), on the untouched tree; then the timed in-place run
        cpu_start = time.process_time()
        api.plan([root], MigrateOptions(jobs=1))
        one_worker_cpu = time.process_time() - cpu_start
        start = time.perf_counter()
        plan = api.plan([root], MigrateOptions())
        planned = time.perf_counter() - start
        api.apply(plan, allow_dirty=True)
        in_place = time.perf_counter() - start
        total_lines = sum(f.lines for f in plan.files)
        analysed = [f.path for f in plan.files if f.path.suffix == ".py" and not f.prefiltered]
        flow_start = time.process_time()
        for path in analysed:  # what the value-flow analysis costs where it could run (an upper bound)
            analyse(path.read_text(encoding="utf-8"))
        flow_seconds = time.process_time() - flow_start
        print(
            f"real-shaped tree: {len(plan.files)} files, {total_lines:,} lines; {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        cores = os.cpu_count() or 1
        print(
            f"in-place run (plan + apply, default jobs): {in_place:.1f} s wall (plan {planned:.1f} s); "
            f"target 30 s: {30 / in_place:.2f}x"
        )
        idle = one_worker_cpu / cores
        print(
            f"one-worker plan: {one_worker_cpu:.1f} CPU s, {total_lines / one_worker_cpu:,.0f} lines per CPU-second; "
            f"spread over {cores} otherwise idle cores that is about {idle:.1f} s (target 30 s: {30 / idle:.2f}x; "
            "pool start and apply not included)"
        )
        print(
            f"value-flow analysis on all {len(analysed)} parsed files (upper bound, stdlib re-parse included): "
            f"{flow_seconds:.1f} CPU s"
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    share_files = max(120, files // 4)  # the same generator and seed, a quarter of the files: 4 plans to run
    print(f"conversion shares on the first {share_files} files of the same tree:")
    for target in (Target.ACCELERATOR, Target.TPU):
        for unsafe in (False, True):
            tree = Path(tempfile.mkdtemp(prefix="tpu-agent-migrate-share-"))
            try:
                result = api.plan(
                    [make_tree(tree, files=share_files, mean_lines=lines)],
                    MigrateOptions(target=target, unsafe_fixes=unsafe),
                )
            finally:
                shutil.rmtree(tree, ignore_errors=True)
            share = conversion_share(result)
            top = ", ".join(f"{code} {count}" for code, count in sorted(share.left.items(), key=lambda kv: -kv[1])[:8])
            print(
                f"target {target.value:<11} unsafe fixes {'on ' if unsafe else 'off'}: {share.converted}/"
                f"{share.references} references converted ({share.converted / share.references:.1%}); of those "
                f"with a TorchTPU form {share.converted}/{share.convertible} ({share.share:.1%}), "
                f"{share.held_back} held back as unsafe; left: {top}"
            )


def breadth(copies: int, filler: int, torchfix: str, torchfix_copies: int) -> None:
    """Issue 28's breadth measurement (see the module docstring). Speeds are also given in CPU seconds of one
    worker (this process; TorchFix's child with -j 1), which other load on a shared machine does not inflate."""
    workdir = Path(tempfile.mkdtemp(prefix="tpu-agent-migrate-breadth-"))
    try:
        root = make_breadth_tree(workdir / "tree", copies=copies, filler_lines=filler)
        cpu: dict[Target, float] = {}
        for target in (Target.ACCELERATOR, Target.TPU):
            cpu_start = time.process_time()
            plan = api.plan([root], MigrateOptions(target=target, jobs=1))
            one_worker_cpu = cpu[target] = time.process_time() - cpu_start
            share = breadth_share(plan)
            left = conversion_share(plan).left
            top = ", ".join(f"{code} {count}" for code, count in sorted(left.items(), key=lambda kv: -kv[1])[:8])
            skipped = [f.skipped_reason for f in plan.files if f.skipped_reason]
            print(
                f"target {target.value:<11}: {share.converted}/{share.convertible} references with a TorchTPU form "
                f"converted ({share.share:.1%}; target 95%), {share.silent.references} missed without a finding "
                f"(in {share.silent.files} files), {len(skipped)} files skipped ({share.skipped_internal} by an "
                f"internal error), {share.internal_findings} edits dropped by an internal error; one-worker plan "
                f"{one_worker_cpu:.1f} CPU s; left: {top}"
            )
            for reason in skipped[:5]:
                print(f"  skipped: {reason}")
        lines = sum(f.lines for f in plan.files)
        cores = os.cpu_count() or 1
        one_worker_cpu = cpu[MigrateOptions().target]  # the in-place run's target
        load = os.getloadavg()[0]
        start = time.perf_counter()
        plan = api.plan([root], MigrateOptions())
        api.apply(plan, allow_dirty=True)
        in_place = time.perf_counter() - start
        broken = [p for p in root.rglob("*.py") if not _parses(p)]
        again = api.plan([root], MigrateOptions())
        print(
            f"breadth tree: {len(plan.files)} files, {lines:,} lines, {cores} cores, load average {load:.1f} before the "
            f"run, {os.getloadavg()[0]:.1f} after; in-place run (plan + apply, default jobs, default target) "
            f"{in_place:.1f} s wall (target 30 s: {30 / in_place:.2f}x); one worker, default target: "
            f"{one_worker_cpu:.1f} CPU s, {lines / one_worker_cpu:,.0f} lines per CPU-second, about "
            f"{one_worker_cpu / cores:.1f} s over {cores} idle cores; {len(broken)} outputs that do not parse; a "
            f"second run changes {len(again.changed_files)} files"
        )
        small = make_breadth_tree(workdir / "small", copies=torchfix_copies, filler_lines=filler)
        side_by_side_with_torchfix([small], workdir / "torchfix-copy", torchfix)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def side_by_side_with_torchfix(roots: list[Path], scratch: Path, torchfix: str) -> None:
    """Time ``torchfix -j 1 --fix`` on a copy of ``roots`` (under ``scratch``) beside tpu-agent's plan + apply with
    one worker on ``roots`` themselves (they are changed: pass copies), in CPU seconds of one worker each (this
    process; TorchFix's child), which other load on a shared machine does not inflate, and print the ratio."""
    if shutil.which(torchfix) is None:
        print(f"TorchFix: {torchfix} not found (install torchfix in a separate environment, pass --torchfix)")
        return
    copies = [shutil.copytree(root, scratch / f"{i}-{root.name}") for i, root in enumerate(roots)]
    lines = sum(p.read_text(encoding="utf-8", errors="replace").count("\n") for r in roots for p in r.rglob("*.py"))
    cpu_start = time.process_time()
    api.apply(api.plan(roots, MigrateOptions(jobs=1)), allow_dirty=True)
    ours = time.process_time() - cpu_start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([torchfix, "-j", "1", "--fix", *map(str, copies)], capture_output=True, check=False)
    torchfix_wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    theirs = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    print(
        f"TorchFix -j 1 --fix vs tpu-agent plan + apply with one worker, on {lines:,} lines of the same tree: "
        f"{theirs:.1f} vs {ours:.1f} CPU s ({torchfix_wall:.1f} s wall for TorchFix, load average "
        f"{os.getloadavg()[0]:.1f}): tpu-agent at {theirs / ours:.2f}x TorchFix's speed (target 5x)"
    )


def repos(directories: list[Path], torchfix: str, show_misses: int) -> None:
    """Issue 28's measurement on real repositories (see the module docstring)."""
    for target in (Target.ACCELERATOR, Target.TPU):
        totals = [0, 0, 0, 0]  # converted, convertible, skipped, skipped by an internal error
        left: dict[str, int] = {}
        missed: dict[tuple[str, str], list[str]] = {}
        for directory in directories:
            plan = api.plan([directory], MigrateOptions(target=target))
            share = breadth_share(plan)
            for key, places in misses(plan).items():
                missed.setdefault(key, []).extend(places)
            skipped = [f"{f.path}: {f.skipped_reason}" for f in plan.files if f.skipped_reason]
            for code, count in conversion_share(plan).left.items():
                left[code] = left.get(code, 0) + count
            for i, value in enumerate((share.converted, share.convertible, len(skipped), share.skipped_internal)):
                totals[i] += value
            print(
                f"{target.value:<11} {directory.name:<24} {share.converted:>5}/{share.convertible:<5} "
                f"({share.share:6.1%}) {share.silent.references:>4} silent, {len(skipped)} skipped "
                f"({share.skipped_internal} internal), {share.internal_findings} edits dropped internally"
            )
            for reason in skipped[:3]:
                print(f"  skipped: {reason}")
        top = ", ".join(f"{code} {count}" for code, count in sorted(left.items(), key=lambda kv: -kv[1])[:10])
        converted, convertible, skipped_files, internal = totals
        print(
            f"{target.value:<11} TOTAL {converted}/{convertible} ({converted / max(convertible, 1):.1%}; target 95%), "
            f"{skipped_files} files skipped ({internal} by an internal error); left: {top}"
        )
        for (code, what), places in sorted(missed.items(), key=lambda kv: -len(kv[1]))[:show_misses]:
            print(f"  miss {len(places):>3} {code:<6} {what:<60} {' '.join(places[:2])}")
    workdir = Path(tempfile.mkdtemp(prefix="tpu-agent-migrate-repos-"))
    try:
        copies = [shutil.copytree(d, workdir / d.name) for d in directories]
        lines = sum(
            p.read_text(encoding="utf-8", errors="replace").count("\n") for c in copies for p in c.rglob("*.py")
        )
        parsing = [p for c in copies for p in c.rglob("*.py") if _parses(p)]  # some repositories keep Python 2 files
        load = os.getloadavg()[0]
        start = time.perf_counter()
        api.apply(api.plan(copies, MigrateOptions()), allow_dirty=True)
        in_place = time.perf_counter() - start
        broken = [p for p in parsing if not _parses(p)]
        again = api.plan(copies, MigrateOptions())
        print(
            f"in place on copies: {lines:,} lines in {in_place:.1f} s wall (default jobs, load average {load:.1f} "
            f"before, {os.getloadavg()[0]:.1f} after); {len(broken)} outputs that do not parse; a second run "
            f"changes {len(again.changed_files)} files"
        )
        fresh = [shutil.copytree(d, workdir / "fresh" / d.name) for d in directories]
        side_by_side_with_torchfix(fresh, workdir / "torchfix", torchfix)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _parses(path: Path) -> bool:
    try:
        ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2_400, help="files in the corpus (default 2400)")
    parser.add_argument("--lines", type=int, default=150, help="mean lines per file (default 150)")
    parser.add_argument("--cuda-share", type=float, default=0.25, help="share of files using CUDA (default 0.25)")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="workers for the parallel run (default: cores)"
    )
    parser.add_argument("--real-tree", action="store_true", help="measure the real-shaped tree instead (issue 13)")
    parser.add_argument("--breadth", action="store_true", help="measure the breadth tree instead (issue 28)")
    parser.add_argument(
        "--copies", type=int, default=COPIES, help=f"--breadth: files per repository kind (default {COPIES})"
    )
    parser.add_argument("--torchfix", default="torchfix", help="--breadth: the TorchFix command to time beside")
    parser.add_argument(
        "--torchfix-copies", type=int, default=10, help="--breadth: files per kind of the tree TorchFix is timed on"
    )
    parser.add_argument("--repos", type=Path, nargs="+", help="measure these checked-out repositories instead")
    parser.add_argument(
        "--misses", type=int, default=0, help="--repos: print this many groups of misses per target (rule, message)"
    )
    args = parser.parse_args()
    if args.repos:
        repos(args.repos, args.torchfix, args.misses)
        return
    if args.breadth:
        breadth(args.copies, FILLER_LINES, args.torchfix, args.torchfix_copies)
        return
    if args.real_tree:
        real_tree(args.files if args.files != 2_400 else 1_700, args.lines if args.lines != 150 else 260)
        return

    workdir = Path(tempfile.mkdtemp(prefix="tpu-agent-migrate-bench-"))
    try:
        cuda_root, plain_root = make_corpus(workdir, args.files, args.lines, args.cuda_share)
        runs = [
            measure(label, root, jobs)
            for label, root in (("parsed (CUDA files)", cuda_root), ("prefiltered (plain files)", plain_root))
            for jobs in sorted({1, args.jobs})
        ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    total_files = sum(r.files for r in runs if r.jobs == 1)
    total_lines = sum(r.lines for r in runs if r.jobs == 1)
    print(f"corpus: {total_files} files, {total_lines} lines, {args.cuda_share:.0%} using CUDA; {os.cpu_count()} cores")
    print(
        f"{'corpus part':<27}{'jobs':>5}{'files':>7}{'parsed':>8}{'prefilt':>8}{'changed':>8}{'wall s':>9}{'cpu s':>8}"
        f"{'files/s':>9}{'lines/s':>9}{'lines/s/core':>14}{'lines/cpu-s':>13}"
    )
    for r in runs:
        print(
            f"{r.label:<27}{r.jobs:>5}{r.files:>7}{r.parsed:>8}{r.prefiltered:>8}{r.changed:>8}{r.seconds:>9.2f}"
            f"{r.cpu_seconds if r.jobs == 1 else float('nan'):>8.2f}{r.files_per_s:>9.0f}{r.lines_per_s:>9.0f}"
            f"{r.lines_per_s / r.jobs:>14.0f}{r.cpu_rate if r.jobs == 1 else float('nan'):>13.0f}"
        )
    print(
        "lines/s are wall-clock; lines/cpu-s divide by the CPU time used (one worker only), which other load on the "
        f"machine does not inflate. Load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."
    )
    by_key = {(r.label.split()[0], r.jobs): r for r in runs}
    parsed_1 = by_key[("parsed", 1)]
    prefiltered_1 = by_key[("prefiltered", 1)]
    print(
        f"parsed, one worker: {parsed_1.lines_per_s:,.0f} lines/s wall, {parsed_1.cpu_rate:,.0f} lines/cpu-s "
        f"(target {PARSED_TARGET_PER_CORE:,} per core: {parsed_1.lines_per_s / PARSED_TARGET_PER_CORE:.2f}x wall, "
        f"{parsed_1.cpu_rate / PARSED_TARGET_PER_CORE:.2f}x cpu)"
    )
    print(
        f"prefiltered, one worker: {prefiltered_1.lines_per_s:,.0f} lines/s wall, {prefiltered_1.cpu_rate:,.0f} "
        f"lines/cpu-s (target {PREFILTER_TARGET:,}: {prefiltered_1.lines_per_s / PREFILTER_TARGET:.2f}x wall, "
        f"{prefiltered_1.cpu_rate / PREFILTER_TARGET:.2f}x cpu)"
    )
    if args.jobs > 1:
        parallel = by_key[("parsed", args.jobs)]
        print(f"parsed, {args.jobs} workers vs one: {parallel.lines_per_s / parsed_1.lines_per_s:.2f}x speed-up")


if __name__ == "__main__":
    main()
