"""Diffs that are proven before they are offered: each one applied to a copy of the script's folder, run, and the
rule run again on the patched capture.

Coding agents apply a finding's diff without reading it, so a diff that pads an ``nn.Module`` or wraps the wrong
line teaches them to break code. Before ``profile`` offers a diff it:

1. copies the folder holding both the working folder and the script (so the relative paths the script was given
   resolve in the copy) into a temporary directory, once per capture (never touching the originals; the folder is
   untrusted: symlinks are copied only when they point at a regular file inside it, and the copy is bounded in
   files and bytes), and applies the diff to a fresh clone of it, hunk by hunk against its context;
2. checks that the patched file parses;
3. runs the patched script with ``tpu-agent profile`` for a few steps on the same runtime and options (chip, ranks,
   eager mode, compiler, warm-up), stopping it when its window ends;
4. compares the first losses of the two runs (what the script called ``backward()`` on, recorded by
   :mod:`tpu_agent.profile.capture.losses`) within torch's compiled-versus-eager bound, or bfloat16's for a
   precision change, which says so;
5. reads the same rule on the patched capture: the finding must be gone or its measure lower.

A diff that passes is marked ``verified`` with the measure before and after; one that fails because of the diff
(it does not apply or parse, the patched script crashes where the unpatched copy runs, the losses differ, the
finding stays) is withdrawn (the advice stays in words) with the reason. Verification that does not run
(``--no-verify``, a capture longer than the limit, a script run as a module, a folder over the copy limits, a diff
outside it, the time limit, a script that does not run from a copy even unpatched) leaves the diff marked
``not_checked`` with the reason.
"""

from __future__ import annotations

import ast
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tpu_agent.check.compare import TOLERANCES, XLA_TOLERANCES, Tolerance
from tpu_agent.fsutil import atomic_write_text
from tpu_agent.processes import stop_group
from tpu_agent.profile.layout import HOOK_SPEC, VERIFIED_FILE
from tpu_agent.profile.model import Diagnosis, Finding, Verification
from tpu_agent.profile.options import ProfileOptions
from tpu_agent.profile.unidiff import DiffError, apply_diff, change_identity, diff_file, moved_lines
from tpu_agent.runtime.api import LaunchTarget
from tpu_agent.runtime.envvars import EVENTS_DIR_ENV, HOOKS_ENV

MAX_COPY_FILES = 2_000  # a script's folder with more is a repository, not a script: not copied
MAX_COPY_BYTES = 64 * 1024 * 1024
STOP_GRACE_S = 5.0  # a stopped patched run's time to exit on SIGTERM before SIGKILL
MAX_REPORT_BYTES = 64 * 1024 * 1024  # the patched run's JSON report read at most
STDERR_TAIL_BYTES = 8192  # its stderr kept for the reason a run failed
MAX_DIFFS = 8  # diffs checked per capture; the rest stay marked not_checked
SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache", ".pytest_cache"})
# A fix must not change the model's numbers: the bound torch holds a compiled graph to against eager (a fix may move
# ops into or out of a compiled graph); a precision change is held to bfloat16's and says so.
LOSS_TOLERANCE: Tolerance = XLA_TOLERANCES["float32"]
PRECISION_TOLERANCE: Tolerance = TOLERANCES["bfloat16"]
# Units of measures that count over the measured window (SH-1's distinct shape sets, EM-4's steps with new graphs):
# the patched run's window is shorter, so a finding still there is compared per step.
WINDOW_COUNTS = frozenset({"shape sets", "steps"})


class NotVerifiable(Exception):
    """The diff failed its check (the reason is the message): it does not apply or parse, the patched script crashes
    where the unpatched one runs, the losses differ or the finding stays. The diff is withdrawn."""


class NotChecked(Exception):
    """The check could not run for a reason that is not the diff's (the folder is over the copy limits, the diff
    edits a file outside it, the time limit, a script that does not run from a copy): the diff stays, marked
    ``not_checked`` with the reason, as the module docstring promises."""


def copy_folder(root: Path, dest: Path, skip: set[Path]) -> None:
    """Copy ``root`` into ``dest`` without leaving it: directory symlinks are not entered, file symlinks are copied
    only when they resolve to a regular file inside ``root``; :class:`NotChecked` past the size limits."""
    root = root.resolve()
    files = size = 0
    for current, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(current)
        dirnames[:] = [
            d for d in dirnames if d not in SKIPPED_DIRS and not (here / d).is_symlink() and (here / d) not in skip
        ]
        target_dir = dest / here.relative_to(root)
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            source = here / name
            real = source.resolve()
            if not real.is_relative_to(root) or not real.is_file():
                continue
            files += 1
            size += real.stat().st_size
            if files > MAX_COPY_FILES or size > MAX_COPY_BYTES:
                raise NotChecked(
                    f"the script's folder {root} holds more than {MAX_COPY_FILES} files or "
                    f"{MAX_COPY_BYTES >> 20} MiB; copy the script to a folder of its own to have its diffs checked"
                )
            shutil.copyfile(real, target_dir / name)


def _command(script: Path, args: list[str], options: ProfileOptions, logdir: Path) -> list[str]:
    steps = min(options.steps, options.verify_steps)
    command = [sys.executable, "-m", "tpu_agent", "profile", "--no-verify", "--stop-after-window"]
    command += ["--steps", str(steps), "--warmup", str(options.warmup), "--chip", options.chip]
    command += ["--nproc", str(options.nproc), "--logdir", str(logdir), "--format", "json"]
    command += ["--timeout", f"{options.verify_timeout_s:g}"]
    if options.eager_mode:
        command += ["--eager-mode", options.eager_mode]
    return [*command, str(script), *args]


def child_env(options: ProfileOptions) -> dict[str, str]:
    """The patched run's environment: the run's, without the capture's event folder (the child profile makes its
    own) and with the user's own hooks kept as the first capture had them (the child profile adds its capture hook
    after them, as :func:`tpu_agent.profile.api.profile` did)."""
    env = {**os.environ, **options.env}
    env.pop(EVENTS_DIR_ENV, None)
    own = [h for h in os.environ.get(HOOKS_ENV, "").split(",") if h and h != HOOK_SPEC]
    env.pop(HOOKS_ENV, None)
    if own:
        env[HOOKS_ENV] = ",".join(own)
    return env


def run_bounded(command: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[str, str]:
    """Run ``command`` in a session of its own with its output in temporary files; return its stdout (at most
    :data:`MAX_REPORT_BYTES`) and the tail of its stderr. On the timeout (:class:`subprocess.TimeoutExpired`) or
    anything that interrupts the wait (Ctrl-C, SIGTERM turned into an exception), the child's whole process group is
    stopped before the exception goes on, so no rank outlives the check with its temp copy."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            process.wait(timeout=timeout_s)
        finally:
            stop_group(process, STOP_GRACE_S)  # ranks the child left behind, and the child itself when interrupted
        out.seek(0)
        stdout = out.read(MAX_REPORT_BYTES).decode("utf-8", errors="replace")
        err.seek(max(0, err.seek(0, os.SEEK_END) - STDERR_TAIL_BYTES))
        return stdout, err.read().decode("utf-8", errors="replace")


def run_patched(script: Path, args: list[str], cwd: Path, options: ProfileOptions, logdir: Path) -> dict[str, Any]:
    """Profile the patched copy in a process of its own (its cwd the copy's), with the run's environment and
    compiler; stopped, with every process it started, past the per-fix timeout. Returns its JSON report."""
    try:
        stdout, stderr = run_bounded(
            _command(script, args, options, logdir), cwd, child_env(options), options.verify_timeout_s + 30
        )
    except subprocess.TimeoutExpired:
        raise NotChecked(f"the patched script ran past the {options.verify_timeout_s:g} s limit") from None
    try:
        document = json.loads(stdout)
    except json.JSONDecodeError:
        document = {}
    if not isinstance(document, dict) or "capture" not in document:
        error = document.get("error", {}).get("message") if isinstance(document, dict) else None
        tail = error or " ".join(stderr.strip().splitlines()[-3:])[-400:]
        raise NotVerifiable(f"the patched script could not be profiled: {tail}")
    return document


def _same_finding(
    finding: Finding, candidates: list[dict[str, Any]], lines: set[int] | None = None
) -> dict[str, Any] | None:
    """The patched run's finding of the same rule at the same place: its first location has the same source text
    (a wrapped or re-indented line), else it is at one of ``lines``, where the diff moved the original location's
    line (default: the same number; a line edited in place). Matching by the bare line number after a diff
    inserted lines would take another site's finding (one HS finding per call site) for this one."""
    same_rule = [c for c in candidates if c["rule_id"] == finding.rule_id]
    if not finding.locations:
        return same_rule[0] if same_rule else None
    first = finding.locations[0]
    placed = [c for c in same_rule if c["locations"]]
    by_code = next((c for c in placed if first.code and c["locations"][0].get("code") == first.code), None)
    moved = {first.line} if lines is None else lines
    return by_code or next((c for c in placed if c["locations"][0]["line"] in moved), None)


def _window_length(capture: dict[str, Any]) -> int:
    """Steps in a report's measured window (0 when it has none)."""
    window = capture.get("window")
    return int(window["last_step"]) - int(window["first_step"]) + 1 if isinstance(window, dict) else 0


def check_losses(before: list[float], after: list[float], precision: bool) -> str:
    """Empty when the patched run's first losses match the original's within the bound; else what differs."""
    if not before:
        return ""
    if not after:
        return "the patched run recorded no loss (it no longer calls backward() on a scalar)"
    bound = PRECISION_TOLERANCE if precision else LOSS_TOLERANCE
    for step, (a, b) in enumerate(zip(before, after, strict=False)):
        if not (math.isfinite(a) and math.isfinite(b)) or abs(b - a) > bound.atol + bound.rtol * abs(a):
            return f"the loss of step {step} changed from {a:.6g} to {b:.6g} (allowed {bound.atol:g} + {bound.rtol:g} x |loss|)"
    return ""


def check_root(root: Path) -> Path:
    """``root`` when it may be copied: ``/``, the home folder and the temp folder are refused (:class:`NotChecked`),
    they are not a project."""
    refused = {Path("/"), Path.home().resolve(), Path(tempfile.gettempdir()).resolve()}
    if root in refused:
        raise NotChecked(
            f"the folder to copy is {root}, too wide; run `tpu-agent profile` from the script's folder (or a project "
            "folder above it) to have its diffs checked"
        )
    return root


class _Copy:
    """One capture's copy of the user's folder, made once (walked, bounded, symlinks checked) and cloned fresh for
    each run; it also remembers whether the unpatched script runs from a copy at all.

    The folder copied is the common ancestor of the working folder and the script's, so the relative paths the
    script was given (``--config configs/x.yaml``, a data folder) resolve in the copy as in the capture; when that
    one is too wide or over the limits, the script's own folder (a script that reads nothing relative then still
    gets its diffs checked, and one that does is caught by the unpatched run)."""

    def __init__(self, target: LaunchTarget, options: ProfileOptions, scratch: Path) -> None:
        cwd = Path.cwd().resolve()
        script = Path(target.target).resolve()
        self.scratch, self.options, self.args = scratch, options, target.args
        self.pristine = scratch / "pristine"
        skip = {Path(options.logdir).resolve(), scratch.resolve()}
        refusals: list[str] = []
        for root in dict.fromkeys((Path(os.path.commonpath([cwd, script.parent])), script.parent)):
            try:
                copy_folder(check_root(root), self.pristine, skip)
                break
            except NotChecked as why:
                refusals.append(str(why))
                shutil.rmtree(self.pristine, ignore_errors=True)
        else:
            raise NotChecked("; ".join(refusals))
        self.root, self.script = root, script.relative_to(root)
        self.cwd = cwd.relative_to(root) if cwd.is_relative_to(root) else Path(".")
        self.runs = 0
        self.baseline: str | None = None  # why the unpatched copy fails ("" when it runs); None until needed

    def fresh(self) -> Path:
        """A clean clone of the copy for one run (earlier runs' outputs gone)."""
        self.runs += 1
        run = self.scratch / "run"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(self.pristine, run)
        return run

    def run(self, folder: Path) -> dict[str, Any]:
        """Profile the script in ``folder`` (a clone) from the working folder's place in it."""
        log = self.scratch / f"log{self.runs}"
        return run_patched(folder / self.script, self.args, folder / self.cwd, self.options, log)

    def baseline_error(self) -> str:
        """Why the unpatched script does not run from a copy ("" when it does); run once per capture, and only
        after a patched run failed, so that a script that cannot run from a copy is not blamed on the diff."""
        if self.baseline is None:
            try:
                capture = self.run(self.fresh())["capture"]
                code = capture.get("exit_code")
                self.baseline = "" if code == 0 else f"it exited with code {code}"
            except NotVerifiable as why:
                self.baseline = str(why).replace("the patched script", "it")
        return self.baseline


def _verify_one(finding: Finding, diagnosis: Diagnosis, copy: _Copy) -> Verification:
    change = finding.agent_change
    assert change is not None and change.diff is not None
    edited = Path(diff_file(change.diff))
    edited = (edited if edited.is_absolute() else Path.cwd() / edited).resolve()
    if not edited.is_relative_to(copy.root):
        raise NotChecked(f"the diff edits {edited}, outside the copied folder {copy.root}")
    if not edited.is_file():
        raise NotVerifiable(f"the diff edits {edited}, which is not a regular file")
    not_finite = next((i for i, x in enumerate(diagnosis.model.primary.losses) if not math.isfinite(x)), None)
    if not_finite is not None:
        raise NotChecked(f"the script's loss of step {not_finite} is not a number: no loss to compare the patch's with")
    started = time.monotonic()
    folder = copy.fresh()
    patched = folder / edited.relative_to(copy.root)
    if not patched.is_file():
        raise NotChecked(f"{edited} is in a folder the copy skips ({', '.join(sorted(SKIPPED_DIRS))})")
    text = apply_diff(patched.read_text(encoding="utf-8"), change.diff)
    try:
        ast.parse(text)
    except SyntaxError as error:
        raise NotVerifiable(f"the patched file does not parse: {error.msg} at line {error.lineno}") from None
    patched.write_text(text, encoding="utf-8")
    try:
        run = copy.run(folder)
        crashed = "" if run["capture"].get("exit_code") == 0 else f"exited with code {run['capture'].get('exit_code')}"
    except NotVerifiable as why:
        run, crashed = {}, str(why).replace("the patched script ", "")
    if crashed:
        unpatched = copy.baseline_error()
        if unpatched:
            raise NotChecked(
                f"the script does not run from a copy of {copy.root} even unpatched ({unpatched}); the diff was not run"
            )
        raise NotVerifiable(f"the patched script {crashed} (the unpatched copy runs)")
    capture = run["capture"]
    before_losses = list(diagnosis.model.primary.losses)
    after_losses = [math.nan if x is None else float(x) for x in capture.get("losses", [])]  # the report's null
    metric, before = finding.evidence.metric, float(finding.evidence.value)
    seconds = time.monotonic() - started

    def result(status: str, reason: str, after: float | None = None) -> Verification:
        return Verification(
            status, reason, metric, before, after, tuple(before_losses), tuple(after_losses), round(seconds, 3)
        )

    precision = finding.category == "precision"
    differs = check_losses(before_losses, after_losses, precision)
    if differs:
        return result("failed", f"the fix changes the model's numbers: {differs}")
    where = finding.locations[0] if finding.locations else None
    moved = moved_lines(change.diff, where.line) if where and (Path.cwd() / where.file).resolve() == edited else None
    again = _same_finding(finding, run.get("findings", []), moved)
    after = float(again["evidence"]["value"]) if again else 0.0
    done, note = "the finding is gone", ""
    if again is not None and finding.evidence.unit in WINDOW_COUNTS:
        # the patched run's window is at most --verify-steps long: a count over it drops with the window alone
        steps = (len(diagnosis.model.primary.steps_in_window()), _window_length(capture))
        if not all(steps):
            return result("failed", f"{finding.rule_id} is still reported when patched (its window is unknown)")
        note = f" (a count over the window: {before:g} in {steps[0]} steps, {after:g} in {steps[1]} when patched)"
        metric, before, after = f"{metric} per step", before / steps[0], after / steps[1]
        done = f"{metric} dropped from {before:.3g} to {after:.3g}{note}"
    elif again is not None:
        done = f"{metric} dropped from {before:g} to {after:g}"
    if again is not None and after >= before:
        return result(
            "failed",
            f"{finding.rule_id} still reports {metric} = {after:.3g} (was {before:.3g}) when patched{note}",
            after,
        )
    losses = (
        "no loss to compare (the script calls no backward())"
        if not before_losses
        else f"its first {min(len(before_losses), len(after_losses))} losses match"
        + (" within bfloat16's bound (a precision change)" if precision else "")
    )
    return result("verified", f"the patched copy ran, {losses}, and {done}", after)


def verify_diagnosis(
    diagnosis: Diagnosis,
    target: LaunchTarget,
    options: ProfileOptions,
    capture_s: float,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Check every diff the findings offer (in place: verified, withdrawn or marked not checked); returns the
    report's ``verification`` section: whether it ran, why not, and how long it took."""
    offered = [f for f in diagnosis.findings if f.agent_change is not None and f.agent_change.diff]
    skip = ""
    if not options.verify:
        skip = "verification is off (--no-verify)"
    elif target.is_module:
        skip = "the script runs as a module (-m): its folder is not known to copy"
    elif capture_s > options.verify_capture_limit_s:
        skip = (
            f"the capture took {capture_s:.0f} s, over the {options.verify_capture_limit_s:g} s limit for verifying "
            "(--verify-capture-limit)"
        )
    elif diagnosis.exit_code != 0:
        skip = f"the script exited with code {diagnosis.exit_code}"
    started = time.monotonic()
    scratch = tempfile.TemporaryDirectory(prefix="tpu-agent-verify-")
    copy: _Copy | Exception | None = None  # made once, at the first diff checked; the reason when it cannot be
    try:
        for index, finding in enumerate(offered):
            change = finding.agent_change
            assert change is not None
            reason = skip or (f"only the first {MAX_DIFFS} diffs are checked" if index >= MAX_DIFFS else "")
            if reason:
                finding.agent_change = replace(change, verification=Verification("not_checked", reason))
                continue
            if progress:
                progress(f"verifying the {finding.rule_id} diff on a copy of the script")
            try:
                if copy is None:
                    try:
                        copy = _Copy(target, options, Path(scratch.name))
                    except (NotChecked, OSError, ValueError) as why:
                        copy = why
                if isinstance(copy, Exception):
                    raise NotChecked(str(copy))
                verification = _verify_one(finding, diagnosis, copy)
            except (NotVerifiable, DiffError) as why:
                verification = Verification("failed", str(why))
            except (NotChecked, OSError, UnicodeDecodeError, ValueError) as why:  # not the diff's doing: kept, marked
                verification = Verification("not_checked", str(why))
            kept = change.diff if verification.status != "failed" else None
            finding.agent_change = replace(change, diff=kept, verification=verification)
    finally:
        scratch.cleanup()
    return {
        "enabled": not skip,
        "skipped": skip,
        "diffs": len(offered),
        "verified": sum(1 for f in offered if f.agent_change is not None and f.agent_change.verified),
        "seconds": round(time.monotonic() - started, 3),
    }


def _key(finding: Finding) -> str:
    """A finding's identity within one capture: the rules are deterministic, so the same capture gives the same
    rule and title again."""
    return f"{finding.rule_id}\0{finding.title}"


def save(raw: Path, diagnosis: Diagnosis) -> None:
    """Keep what verification found next to the capture, so ``diagnose`` of it (and MCP ``tpu_diagnose``) reports
    the same verdicts without running anything."""
    results = {
        _key(f): {
            "diff": f.agent_change.diff,
            "change": change_identity(f.agent_change.diff, Path.cwd()) if f.agent_change.diff else None,
            "verification": asdict(f.agent_change.verification),
        }
        for f in diagnosis.findings
        if f.agent_change is not None and f.agent_change.verification is not None
    }
    atomic_write_text(raw / VERIFIED_FILE, json.dumps({"summary": diagnosis.verification, "findings": results}))


NOT_RUN = Verification("not_checked", "`diagnose` does not run the script; `tpu-agent profile` checks each diff")


def _stored(data: Any) -> Verification | None:
    """A verdict read back from ``verified.json``, checked field by field (``None`` when malformed)."""
    try:
        verification = Verification(
            status=str(data["status"]),
            reason=str(data["reason"]),
            metric=str(data["metric"]),
            before=None if data["before"] is None else float(data["before"]),
            after=None if data["after"] is None else float(data["after"]),
            losses_before=tuple(float(x) for x in data["losses_before"]),
            losses_after=tuple(float(x) for x in data["losses_after"]),
            seconds=float(data["seconds"]),
        )
    except (TypeError, KeyError, ValueError):
        return None
    return verification if verification.status in ("verified", "failed", "not_checked") else None


def recall(raw: Path | None, diagnosis: Diagnosis) -> None:
    """Apply the verdicts :func:`save` kept for this capture (a diff the check refused stays withdrawn); a diff
    without one is marked not checked. The file is untrusted: a verdict must name this capture's diff."""
    path = raw / VERIFIED_FILE if raw is not None else None
    stored: dict[str, Any] = {}
    if path is not None and path.is_file() and not path.is_symlink():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            stored = data["findings"] if isinstance(data.get("findings"), dict) else {}
            summary = data.get("summary")
            diagnosis.verification = summary if isinstance(summary, dict) else None
        except (OSError, ValueError, AttributeError):
            stored = {}
    for finding in diagnosis.findings:
        change = finding.agent_change
        if change is None or not change.diff:
            continue
        entry = stored.get(_key(finding))
        verdict = _stored(entry.get("verification")) if isinstance(entry, dict) else None
        # a verdict names this capture's diff; only one that withdrew it (or did not check it) may name none
        named = isinstance(entry, dict) and (
            entry.get("diff") == change.diff
            or (entry.get("change") is not None and entry.get("change") == change_identity(change.diff, Path.cwd()))
            or (entry.get("diff") is None and verdict is not None and verdict.status != "verified")
        )
        verification = verdict if verdict is not None and named else NOT_RUN
        kept = change.diff if verification.status != "failed" else None
        finding.agent_change = replace(change, diff=kept, verification=verification)
