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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_agent.chips import DEFAULT_CHIP, Chip, get_chip
from tpu_agent.errors import ExitCode, TpuAgentError
from tpu_agent.estimate.compiler import compiler_status
from tpu_agent.fsutil import atomic_write_text
from tpu_agent.profile import kineto, xplane
from tpu_agent.profile import verify as verification
from tpu_agent.profile.estimate import attach_compiler_estimate, estimate
from tpu_agent.profile.layout import (
    COMPILED_FILE,
    HOOK_SPEC,
    OPTIONS_FILE,
    REPORT_DIR,
    TRACE_FILE,
    raw_dir,
    report_dir,
)
from tpu_agent.profile.load import load_raw
from tpu_agent.profile.model import Diagnosis, Finding, ProfileModel, RunConfig
from tpu_agent.profile.options import ProfileOptions
from tpu_agent.profile.report import render as render_report
from tpu_agent.profile.report.document import SCHEMA_VERSION, build_document
from tpu_agent.profile.rules import run_rules
from tpu_agent.profile.untrusted import confined, reading, safe_name, write_confined
from tpu_agent.runtime.api import LaunchTarget, RunOptions, launch
from tpu_agent.runtime.envvars import EVENTS_DIR_ENV, HOOKS_ENV

REPORT_FORMATS = ("json", "markdown", "html")
_EXTENSIONS = {"json": "json", "markdown": "md", "html": "html", "text": "txt"}
ANNOTATED_SUFFIX = "_tpu-agent"
POLL_S = 0.25  # how often the preloader looks for a finished trace: often enough to finish before the script


@dataclass
class ProfileResult:
    """What ``profile`` produced: the script's exit code and the diagnosis of its capture."""

    logdir: Path
    exit_code: int
    xplane_paths: list[Path]
    findings: list[Finding]
    report: Diagnosis


def render(diagnosis: Diagnosis, fmt: str) -> str:
    """Render ``diagnosis`` as text, json, markdown or html."""
    return render_report(diagnosis, fmt)


def _write_reports(diagnosis: Diagnosis, root: Path) -> list[Path]:
    out = report_dir(diagnosis.logdir)
    confined(root, out)
    paths = []
    for fmt in REPORT_FORMATS:
        path = out / f"report.{_EXTENSIONS[fmt]}"
        write_confined(root, path, render(diagnosis, fmt).encode("utf-8"))
        paths.append(path)
    return paths


def _sessions(logdir: Path) -> list[Path]:
    root = logdir / "plugins" / "profile"
    return sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name) if root.is_dir() else []


def _analyse(logdir: Path, model: ProfileModel) -> Diagnosis:
    findings, outcomes = run_rules(model)
    return Diagnosis(logdir=logdir, model=model, findings=findings, outcomes=outcomes, estimate=estimate(model))


XPROF_CACHES = ("ALL_HOSTS.*", ".cached_tools.json", "cache_version.txt")


def _drop_xprof_caches(session: Path, root: Path) -> None:
    """XProf caches tool results next to the xplane; they would describe the xplane we are about to replace."""
    for pattern in XPROF_CACHES:
        for path in session.glob(pattern):
            if path.is_symlink() or path.is_file():
                confined(root, path.parent)
                path.unlink()


def _diagnose_own(logdir: Path, root: Path, chip: Chip | None) -> Diagnosis:
    raw = raw_dir(logdir)
    confined(root, raw)
    model = load_raw(raw, chip)
    with reading(raw, "the capture"):  # values of the right type can still contradict each other
        diagnosis = _analyse(logdir, model)
    name = (
        safe_name(model.config.session, raw / OPTIONS_FILE, "session")
        if model.config.session
        else xplane.session_name()
    )
    session = logdir / "plugins" / "profile" / name
    confined(root, session)
    _drop_xprof_caches(session, root)
    with reading(raw, "the capture"):  # e.g. timestamps an XSpace cannot hold
        diagnosis.xplane_paths = xplane.write_session(
            session, model.ranks.values(), diagnosis.findings, model.config.world_size, root
        )
    return diagnosis


def _xplane_files(path: Path) -> list[Path]:
    if path.is_file() and path.name.endswith(".xplane.pb"):
        return [path]
    if path.is_dir() and any(path.glob("*.xplane.pb")):
        return sorted(p for p in path.glob("*.xplane.pb") if p.is_file())
    foreign = [s for s in _sessions(path) if not s.name.endswith(ANNOTATED_SUFFIX) and any(s.glob("*.xplane.pb"))]
    return sorted(p for p in foreign[-1].glob("*.xplane.pb") if p.is_file()) if foreign else []


def _rank_of(path: Path, index: int) -> int:
    stem = path.name.removesuffix(".xplane.pb")
    suffix = stem.rpartition("_")[2]
    return int(suffix) if "_" in stem and suffix.isdigit() and len(suffix) <= 6 else index


def _annotated_dir(session: Path, root: Path) -> Path:
    """Where the annotated copy of a foreign session goes: next to it when that is still inside the log
    directory given (TensorBoard then lists it as one more session), else under ``<root>/tpu-agent/``."""
    name = f"{session.name}{ANNOTATED_SUFFIX}"
    if session.resolve() != root.resolve():
        return session.parent / name
    return report_dir(root) / name


def _diagnose_xspace(files: list[Path], root: Path, chip: Chip | None) -> Diagnosis:
    ranks = {}
    for index, path in enumerate(files):
        with reading(path, "the XSpace (.xplane.pb)"):
            rank = xplane.read_xspace(path, _rank_of(path, index))
        ranks[rank.rank] = rank
    config = RunConfig(chip=chip or get_chip(DEFAULT_CHIP), world_size=len(ranks), source="xspace")
    model = ProfileModel(config=config, ranks=ranks)
    session = files[0].parent
    with reading(session, "the XSpace session"):
        diagnosis = _analyse(root, model)
    target_dir = _annotated_dir(session, root)
    confined(root, target_dir)
    for index, path in enumerate(files):
        target = target_dir / path.name
        rank_id = _rank_of(path, index)
        with reading(path, "the XSpace (.xplane.pb)"):
            xplane.annotate(path, target, [f for f in diagnosis.findings if f.rank in (None, rank_id)], root)
        diagnosis.xplane_paths.append(target)
    return diagnosis


def _log_root(logdir: Path) -> Path:
    """The directory nothing may be written or deleted outside of: the log directory given (or, for a single
    ``.xplane.pb``, the directory holding it)."""
    return logdir.parent if logdir.is_file() else logdir


def _diagnose(
    logdir: Path,
    chip: Chip | None,
    exit_code: int | None,
    no_compiler_note: str = "",
    verify: Callable[[Diagnosis], dict[str, Any]] | None = None,
) -> Diagnosis:
    logdir = Path(logdir)
    if not logdir.exists():
        raise TpuAgentError(
            "no-logdir", f"{logdir} does not exist", "pass the --logdir of an earlier `tpu-agent profile` run"
        )
    root = _log_root(logdir)
    own = raw_dir(logdir) if logdir.is_dir() and raw_dir(logdir).is_dir() else None
    if own is not None:
        with kineto.gc_paused():  # the op model and its XSpace: ~10^5 acyclic objects built in one go
            diagnosis = _diagnose_own(logdir, root, chip)
    else:
        files = _xplane_files(logdir)
        if not files:
            raise TpuAgentError(
                "no-capture",
                f"{logdir} holds neither a tpu-agent capture ({REPORT_DIR}/raw) nor any *.xplane.pb under "
                "plugins/profile/",
                "run `tpu-agent profile SCRIPT --logdir DIR` first, or point at a TensorBoard/XProf log directory",
            )
        diagnosis = _diagnose_xspace(files, root, chip)
    diagnosis.exit_code = exit_code
    compiled = diagnosis.model.compiled
    attach_compiler_estimate(diagnosis.estimate, compiled.document if compiled else None, no_compiler_note)
    if verify is not None and own is not None:
        diagnosis.verification = verify(diagnosis)
        verification.save(own, diagnosis)
    else:  # a foreign capture (own None) was never checked
        verification.recall(own, diagnosis)
    diagnosis.document = build_document(diagnosis)
    diagnosis.report_paths = _write_reports(diagnosis, root)
    return diagnosis


def diagnose(logdir: Path, chip: str | None = None) -> Diagnosis:
    """Re-analyse a capture: a ``tpu-agent profile`` logdir, or an XProf logdir/session/file from TorchTPU or JAX.

    ``chip`` overrides the chip the capture was made for (estimates and MXU/HBM rules use it). A foreign
    session is annotated into a copy, ``<session>_tpu-agent``, with a "tpu-agent diagnostics" line. Every
    file and path in the capture is untrusted: nothing is written or deleted outside ``logdir``.
    """
    return _diagnose(logdir, get_chip(chip) if chip else None, None)


def _prepare_logdir(logdir: Path, target: LaunchTarget, options: ProfileOptions) -> Path:
    raw = raw_dir(logdir)
    if raw.exists() or raw.is_symlink():
        confined(logdir, raw)
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
        "stop_after_window": options.stop_after_window,
        "cwd": os.getcwd(),
        "started": time.time(),
        "session": xplane.session_name(),
    }
    atomic_write_text(raw / OPTIONS_FILE, json.dumps(record, indent=2))
    return raw


class _OpsPreloader:
    """Parses each rank's trace as soon as its capture hook writes it (when the measured window ends), while
    this process only waits for the script; the analysis then finds it parsed."""

    def __init__(self, raw: Path) -> None:
        self.raw = raw
        self.seen: set[Path] = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tpu-agent-ops-preload", daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(POLL_S):
            for path in self.raw.glob(TRACE_FILE.format(rank="*")):
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


def _compiler_estimate(
    target: LaunchTarget, options: ProfileOptions, progress: Callable[[str], None] | None
) -> tuple[dict[str, Any] | None, str]:
    """The TPU compiler's estimate of the same script (a second, short run), when libtpu is here and wanted.

    Returns the estimate document (``tpu-agent estimate``'s JSON), or None and why there is none (never fails
    the profile)."""
    if not options.tpu_compiler or not compiler_status().available:
        return None, ""
    # Imported only when the pass runs: the estimate's script module loads torch, seconds of CPU that this
    # process (which only launches and reads files) would otherwise spend on every profile.
    from tpu_agent.estimate.script import EstimateOptions, estimate_script

    if progress:
        progress(f"compiling the step for {options.chip} with the TPU compiler")
    try:
        result = estimate_script(target, EstimateOptions(target=options.chip, timeout_s=options.timeout_s))
    except TpuAgentError as error:
        return None, error.message
    return result.document, ""


def profile(
    target: LaunchTarget, options: ProfileOptions, progress: Callable[[str], None] | None = None
) -> ProfileResult:
    """Run ``target`` on the runtime with profiling on, then diagnose the capture.

    The script's own exit code is returned in the result; a capture with no data at all is an error.
    """
    options.check()  # parses --chip, once: everything below takes options.tpu
    logdir = Path(options.logdir)
    raw = _prepare_logdir(logdir, target, options)
    hooks = ",".join(h for h in (os.environ.get(HOOKS_ENV, ""), HOOK_SPEC) if h)
    # The capture hook reads its window from options.json in the event directory: its one source of settings.
    # The hash seed fixed too (set iteration order): verification compares this run's losses with a patched copy's.
    seeded = {"PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    env = {**seeded, **options.env, EVENTS_DIR_ENV: str(raw.resolve()), HOOKS_ENV: hooks}
    if progress:
        progress(f"running {target.target} with profiling on ({options.nproc} rank(s), chip {options.chip})")
    started = time.monotonic()
    with _OpsPreloader(raw):
        exit_code = launch(
            target,
            RunOptions(
                nproc=options.nproc,
                chip=options.chip,
                eager_mode=options.eager_mode,
                env=env,
                timeout_s=options.timeout_s,
            ),
        )
    capture_s = time.monotonic() - started
    document, no_compiler_note = _compiler_estimate(target, options, progress) if exit_code == 0 else (None, "")
    if document is not None:  # kept with the capture: `diagnose` of this logdir then weighs it too
        atomic_write_text(raw / COMPILED_FILE, json.dumps(document))
    if progress:
        progress("analysing the capture")
    try:
        diagnosis = _diagnose(
            logdir,
            options.tpu.chip,
            exit_code,
            no_compiler_note,
            lambda found: verification.verify_diagnosis(found, target, options, capture_s, progress),
        )
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
        logdir=logdir,
        exit_code=exit_code,
        xplane_paths=diagnosis.xplane_paths,
        findings=diagnosis.findings,
        report=diagnosis,
    )


__all__ = ["Diagnosis", "ProfileOptions", "ProfileResult", "diagnose", "profile", "render", "SCHEMA_VERSION"]
