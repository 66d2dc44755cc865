"""Public API of ``tpu_agent.profile``: capture a run, diagnose a capture, render the result.

``profile(target, options)`` runs the script on the runtime with the capture hook, writes an XProf session
(``<logdir>/plugins/profile/<timestamp>/<host>[_<rank>].xplane.pb``) and our reports next to ``plugins/``
(``<logdir>/tpu-agent/report.{json,md,html}``). ``diagnose(logdir)`` re-analyses a capture: ours (from
the raw files) or any XSpace written by TorchTPU or JAX, which it annotates in a new session.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_agent import __version__
from tpu_agent.chips import DEFAULT_CHIP, get_chip
from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.fsutil import atomic_write_text
from tpu_agent.profile import capture, kineto, xplane
from tpu_agent.profile.estimate import Estimate, estimate
from tpu_agent.profile.load import OPTIONS_FILE, REPORT_DIR, load_raw, raw_dir
from tpu_agent.profile.model import Finding, ProfileModel, RuleOutcome, RunConfig, Severity, Status
from tpu_agent.profile.rules import run_rules
from tpu_agent.runtime.api import LaunchTarget, RunOptions, launch

SCHEMA_VERSION = 1
REPORT_FORMATS = ("json", "markdown", "html")
_EXTENSIONS = {"json": "json", "markdown": "md", "html": "html", "text": "txt"}
ANNOTATED_SUFFIX = "_tpu-agent"


@dataclass
class ProfileOptions:
    """How to capture: the measured window, where to write, and how to run (chip, ranks, eager mode)."""

    steps: int = 10
    warmup: int = 2
    logdir: Path = field(default_factory=lambda: Path("tpu-agent-profile"))
    chip: str = DEFAULT_CHIP
    nproc: int = 1
    eager_mode: str | None = None  # strict | debug | defer-and-fuse | None (environment default)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None


@dataclass
class Diagnosis:
    """Findings, per-rule outcomes and the TPU estimate for one capture, plus where it all was written."""

    logdir: Path
    model: ProfileModel
    findings: list[Finding]
    outcomes: list[RuleOutcome]
    estimate: Estimate
    xplane_paths: list[Path] = field(default_factory=list)
    report_paths: list[Path] = field(default_factory=list)
    exit_code: int | None = None  # the profiled script's, when this came from `profile`
    _document: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def has_errors(self) -> bool:
        return any(f.severity == Severity.error for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (schema in docs/profile-json-schema.md).

        Built once and shared by every renderer (the report files and the CLI's output); ``profile`` and
        ``diagnose`` first ask for it when the diagnosis is complete (exit code and XSpace paths set).
        """
        if self._document is None:
            self._document = report_dict(self)
        return self._document


@dataclass
class ProfileResult:
    """What ``profile`` produced: the script's exit code and the diagnosis of its capture."""

    logdir: Path
    exit_code: int
    xplane_paths: list[Path]
    findings: list[Finding]
    report: Diagnosis


def _ms(ns: float) -> float:
    return round(ns / 1e6, 4)


def _op_table(model: ProfileModel, limit: int = 25) -> list[dict[str, Any]]:
    rank = model.primary
    steps = {s.index for s in rank.steps_in_window()}
    groups: dict[str, list[Any]] = defaultdict(list)
    for op in rank.ops:
        if op.top_level and op.step in steps:
            groups[op.name].append(op)
    total = sum(op.duration_ns for ops in groups.values() for op in ops) or 1
    kernel_flops: dict[str, float] = defaultdict(float)
    for op in rank.ops:
        if op.costed and op.step in steps:
            kernel_flops[op.name] += op.flops
    rows = []
    for name, ops in sorted(groups.items(), key=lambda item: -sum(o.duration_ns for o in item[1]))[:limit]:
        shapes = defaultdict(int)
        for op in ops:
            shapes[str(op.input_shapes)] += 1
        rows.append(
            {
                "name": name,
                "calls": len(ops),
                "total_ms": _ms(sum(o.duration_ns for o in ops)),
                "share": round(sum(o.duration_ns for o in ops) / total, 4),
                "flops": kernel_flops.get(name, 0.0),
                "dtypes": sorted({t for o in ops for t in o.input_dtypes if t and t not in ("Scalar", "ScalarList")}),
                "top_shapes": [s for s, _ in sorted(shapes.items(), key=lambda kv: -kv[1])[:3]],
            }
        )
    return rows


def _memory_dict(model: ProfileModel) -> dict[str, Any]:
    rank = model.primary
    timeline = rank.memory_timeline
    stride = max(len(timeline) // 400, 1)
    data: dict[str, Any] = {
        "hbm_bytes_per_device": model.config.chip.hbm_bytes_per_device,
        "timeline": [{"time_ns": p.time_ns, "allocated_bytes": p.allocated_bytes} for p in timeline[::stride]],
    }
    if rank.memory is not None:
        m = rank.memory
        data.update(
            param_bytes=m.param_bytes,
            grad_bytes=m.grad_bytes,
            optimizer_bytes=m.optimizer_bytes,
            activation_bytes=m.activation_bytes,
            peak_bytes=m.peak_bytes,
        )
    return data


def _step_stats(model: ProfileModel) -> dict[str, Any]:
    window = model.primary.steps_in_window()
    durations = [s.duration_ns for s in window]
    if not durations:
        return {"count": 0}
    return {
        "count": len(durations),
        "median_ms": _ms(statistics.median(durations)),
        "mean_ms": _ms(statistics.fmean(durations)),
        "min_ms": _ms(min(durations)),
        "max_ms": _ms(max(durations)),
    }


def report_dict(diagnosis: Diagnosis) -> dict[str, Any]:
    """Build the stable JSON document every renderer reads."""
    model = diagnosis.model
    config = model.config
    rank = model.primary
    window = rank.steps_in_window()
    counts = {s.value: sum(1 for f in diagnosis.findings if f.severity == s) for s in Severity}
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "tpu-agent", "version": __version__},
        "capture": {
            "logdir": str(diagnosis.logdir),
            "source": config.source,
            "script": config.script,
            "exit_code": diagnosis.exit_code,
            "chip": config.chip.key,
            "eager_mode": config.eager_mode,
            "backend": config.backend,
            "world_size": config.world_size,
            "ranks": sorted(model.ranks),
            "requested_steps": config.requested_steps,
            "requested_warmup": config.requested_warmup,
            "window": {"first_step": window[0].index, "last_step": window[-1].index} if window else None,
            "xplane_files": [str(p) for p in diagnosis.xplane_paths],
            "warnings": sorted({w for r in model.ranks.values() for w in r.warnings}),
        },
        "step_time": _step_stats(model),
        "steps": [
            {
                "rank": r.rank,
                "index": s.index,
                "start_ns": s.start_ns,
                "duration_ms": _ms(s.duration_ns),
                "in_window": s in r.steps_in_window(),
                "peak_bytes": r.step_peaks.get(s.index),
            }
            for r in model.ranks.values()
            for s in r.steps
        ],
        "ops": _op_table(model),
        "memory": _memory_dict(model),
        "estimate": diagnosis.estimate.to_dict(),
        "summary": {
            "errors": counts["error"],
            "warnings": counts["warning"],
            "infos": counts["info"],
            "insufficient_data": sum(1 for o in diagnosis.outcomes if o.status == Status.insufficient_data),
        },
        "findings": [f.to_dict() for f in diagnosis.findings],
        "rules": [o.to_dict() for o in diagnosis.outcomes],
    }


def render(diagnosis: Diagnosis, fmt: str) -> str:
    """Render ``diagnosis`` as text, json, markdown or html."""
    from tpu_agent.profile.report import render as _render

    return _render(diagnosis, fmt)


def _write_reports(diagnosis: Diagnosis) -> list[Path]:
    out = diagnosis.logdir / REPORT_DIR
    paths = []
    for fmt in REPORT_FORMATS:
        path = out / f"report.{_EXTENSIONS[fmt]}"
        atomic_write_text(path, render(diagnosis, fmt))
        paths.append(path)
    return paths


def _sessions(logdir: Path) -> list[Path]:
    root = logdir / "plugins" / "profile"
    return sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name) if root.is_dir() else []


def _analyse(logdir: Path, model: ProfileModel) -> Diagnosis:
    findings, outcomes = run_rules(model)
    return Diagnosis(logdir=logdir, model=model, findings=findings, outcomes=outcomes, estimate=estimate(model))


XPROF_CACHES = ("ALL_HOSTS.*", ".cached_tools.json", "cache_version.txt")


def _drop_xprof_caches(session: Path) -> None:
    """XProf caches tool results next to the xplane; they would describe the xplane we are about to replace."""
    for pattern in XPROF_CACHES:
        for path in session.glob(pattern):
            path.unlink()


def _diagnose_own(logdir: Path, chip: str | None) -> Diagnosis:
    model = load_raw(raw_dir(logdir))
    if chip:
        model.config.chip = get_chip(chip)
    diagnosis = _analyse(logdir, model)
    session = logdir / "plugins" / "profile" / (model.config.session or xplane.session_name())
    _drop_xprof_caches(session)
    diagnosis.xplane_paths = xplane.write_session(session, model.ranks.values(), diagnosis.findings, model.config.world_size)
    return diagnosis


def _xplane_files(path: Path) -> list[Path]:
    if path.is_file() and path.name.endswith(".xplane.pb"):
        return [path]
    if path.is_dir() and any(path.glob("*.xplane.pb")):
        return sorted(path.glob("*.xplane.pb"))
    foreign = [s for s in _sessions(path) if not s.name.endswith(ANNOTATED_SUFFIX) and any(s.glob("*.xplane.pb"))]
    return sorted(foreign[-1].glob("*.xplane.pb")) if foreign else []


def _rank_of(path: Path, index: int) -> int:
    stem = path.name.removesuffix(".xplane.pb")
    suffix = stem.rpartition("_")[2]
    return int(suffix) if "_" in stem and suffix.isdigit() else index


def _report_root(session: Path) -> Path:
    """Where reports about a foreign session go: the XProf logdir that holds it (never the session itself)."""
    if session.parent.name == "profile" and session.parent.parent.name == "plugins":
        return session.parent.parent.parent
    return session.parent


def _diagnose_xspace(files: list[Path], chip: str | None) -> Diagnosis:
    ranks = {}
    for index, path in enumerate(files):
        rank = xplane.read_xspace(path, _rank_of(path, index))
        ranks[rank.rank] = rank
    config = RunConfig(chip=get_chip(chip or DEFAULT_CHIP), world_size=len(ranks), source="xspace")
    model = ProfileModel(config=config, ranks=ranks)
    session = files[0].parent
    diagnosis = _analyse(_report_root(session), model)
    target_dir = session.parent / f"{session.name}{ANNOTATED_SUFFIX}"
    for index, path in enumerate(files):
        target = target_dir / path.name
        rank_id = _rank_of(path, index)
        xplane.annotate(path, target, [f for f in diagnosis.findings if f.rank in (None, rank_id)])
        diagnosis.xplane_paths.append(target)
    return diagnosis


def _diagnose(logdir: Path, chip: str | None, exit_code: int | None) -> Diagnosis:
    logdir = Path(logdir)
    if not logdir.exists():
        raise TpuAgentError("no-logdir", f"{logdir} does not exist", "pass the --logdir of an earlier `tpu-agent profile` run")
    if raw_dir(logdir).is_dir():
        with kineto.gc_paused():  # the op model and its XSpace: ~10^5 acyclic objects built in one go
            diagnosis = _diagnose_own(logdir, chip)
    else:
        files = _xplane_files(logdir)
        if not files:
            raise TpuAgentError(
                "no-capture",
                f"{logdir} holds neither a tpu-agent capture ({REPORT_DIR}/raw) nor any *.xplane.pb under plugins/profile/",
                "run `tpu-agent profile SCRIPT --logdir DIR` first, or point at a TensorBoard/XProf log directory",
            )
        diagnosis = _diagnose_xspace(files, chip)
    diagnosis.exit_code = exit_code
    diagnosis.report_paths = _write_reports(diagnosis)
    return diagnosis


def diagnose(logdir: Path, chip: str | None = None) -> Diagnosis:
    """Re-analyse a capture: a ``tpu-agent profile`` logdir, or an XProf logdir/session/file from TorchTPU or JAX.

    ``chip`` overrides the chip the capture was made for (estimates and MXU/HBM rules use it). A foreign
    session is annotated into a copy, ``<session>_tpu-agent``, with a "tpu-agent diagnostics" line.
    """
    return _diagnose(logdir, chip, None)


def _prepare_logdir(logdir: Path, target: LaunchTarget, options: ProfileOptions) -> Path:
    raw = raw_dir(logdir)
    if raw.exists():
        shutil.rmtree(raw)  # the event log appends; a previous capture must not leak into this one
    raw.mkdir(parents=True)
    record = {
        "script": str(Path(target.target).resolve()) if not target.is_module else target.target,
        "args": list(target.args),
        "steps": options.steps,
        "warmup": options.warmup,
        "chip": options.chip,
        "nproc": options.nproc,
        "eager_mode": options.eager_mode,
        "cwd": os.getcwd(),
        "started": time.time(),
        "session": xplane.session_name(),
    }
    atomic_write_text(raw / OPTIONS_FILE, json.dumps(record, indent=2))
    return raw


def _check_options(options: ProfileOptions) -> None:
    if options.steps < 1:
        raise TpuAgentError("bad-steps", f"--steps must be at least 1 (got {options.steps})", "measure 10 steps or more")
    if options.warmup < 0:
        raise TpuAgentError("bad-warmup", f"--warmup must be 0 or more (got {options.warmup})", "use --warmup 2")
    get_chip(options.chip)


class _OpsPreloader:
    """Parses each rank's trace as soon as its capture hook writes it (when the measured window ends), while
    this process only waits for the script; the analysis then finds it parsed."""

    def __init__(self, raw: Path) -> None:
        self.raw = raw
        self.seen: set[Path] = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tpu-agent-ops-preload", daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(0.05):
            for path in self.raw.glob(capture.TRACE_FILE.format(rank="*")):
                if path not in self.seen:
                    self.seen.add(path)
                    # A file this cannot parse is read (and reported) again by the analysis itself.
                    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                        kineto.preload_ops(path)

    def __enter__(self) -> _OpsPreloader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()


def profile(target: LaunchTarget, options: ProfileOptions, progress: Callable[[str], None] | None = None) -> ProfileResult:
    """Run ``target`` on the runtime with profiling on, then diagnose the capture.

    The script's own exit code is returned in the result; a capture with no data at all is an error.
    """
    _check_options(options)
    logdir = Path(options.logdir)
    raw = _prepare_logdir(logdir, target, options)
    hooks = ",".join(h for h in (os.environ.get("TPU_AGENT_HOOKS", ""), capture.HOOK_SPEC) if h)
    env = {
        **options.env,
        "TPU_AGENT_EVENTS_DIR": str(raw.resolve()),
        capture.PROFILE_DIR_ENV: str(raw.resolve()),
        capture.PROFILE_STEPS_ENV: str(options.steps),
        capture.PROFILE_WARMUP_ENV: str(options.warmup),
        "TPU_AGENT_HOOKS": hooks,
    }
    if progress:
        progress(f"running {target.target} with profiling on ({options.nproc} rank(s), chip {options.chip})")
    with _OpsPreloader(raw):
        exit_code = launch(
            target,
            RunOptions(nproc=options.nproc, chip=options.chip, eager_mode=options.eager_mode, env=env, timeout_s=options.timeout_s),
        )
    if progress:
        progress("analysing the capture")
    try:
        diagnosis = _diagnose(logdir, options.chip, exit_code)
    except TpuAgentError as error:
        if exit_code != 0:
            raise TpuAgentError(
                "script-failed",
                f"{target.target} exited with code {exit_code} before anything was captured",
                "run it with `tpu-agent run` first and fix the error above",
                ExitCode.FINDINGS,
            ) from error
        raise
    return ProfileResult(
        logdir=logdir, exit_code=exit_code, xplane_paths=diagnosis.xplane_paths, findings=diagnosis.findings, report=diagnosis
    )


__all__ = ["Diagnosis", "ProfileOptions", "ProfileResult", "diagnose", "profile", "render", "SCHEMA_VERSION"]
