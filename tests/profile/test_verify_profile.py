"""Diffs are proven before they are offered: applied to a copy, run, losses compared, the rule read again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from profile_helpers import SCRIPTS, SEEDED, Captures, seed_line

from tpu_agent.profile import patches, unidiff, verify
from tpu_agent.profile.model import Verification


def _offered_diffs_are_verified(report: dict) -> None:  # type: ignore[type-arg]
    """The promise: a diff in a verifying run's report has been checked; anything else is words only."""
    for finding in report["findings"]:
        change = finding["agent_change"] or {}
        if change.get("diff"):
            assert change["verified"] and change["verification"]["status"] == "verified", finding
        elif change.get("verification"):
            assert change["verification"]["status"] == "failed" and change["verification"]["reason"], finding


@pytest.mark.slow
def test_host_sync_diffs_are_verified_on_a_copy(captures: Captures) -> None:
    """host_sync.py: the HS-1 diff (.item() -> .detach()) runs on a copy with the same three losses and no sync
    left; the PR-1 autocast diff is a precision change, held to bfloat16's bound and saying so."""
    logdir, report, _ = captures.get("host_sync.py", verify=True)
    assert report["verification"]["enabled"] and report["verification"]["seconds"] > 0
    assert len(report["capture"]["losses"]) == 3
    _offered_diffs_are_verified(report)
    hs1 = next(f for f in report["findings"] if f["rule_id"] == "HS-1")
    assert hs1["locations"][0]["line"] == seed_line(SCRIPTS / "host_sync.py", "HS-1")
    checked = hs1["agent_change"]["verification"]
    assert (checked["before"], checked["after"]) == (1.0, 0.0)
    assert checked["losses_after"] == checked["losses_before"] == report["capture"]["losses"]
    pr1 = next(f for f in report["findings"] if f["rule_id"] == "PR-1")
    assert pr1["agent_change"]["verified"] and "bfloat16" in pr1["agent_change"]["verification"]["reason"]
    # diagnose of the same capture reports the same verdicts (MCP tpu_diagnose reads it the same way)
    from tpu_agent.profile.api import diagnose

    again = {f.rule_id: f.agent_change for f in diagnose(logdir).findings if f.agent_change}
    assert again["HS-1"] is not None and again["HS-1"].verified and again["HS-1"].diff == hs1["agent_change"]["diff"]


@pytest.mark.slow
# one patched run per rule that offers a diff in the seeded suite, and half the seeded captures: minutes
@pytest.mark.long(seconds=150)
def test_no_rule_offers_an_unverified_diff_in_the_seeded_suite(
    captures: Captures, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite-wide guard: each rule that builds a diff on any seeded script has its first such diff checked
    (applied to a copy, run, losses compared, the rule read again): it must come out verified, or withdrawn with the
    reason (the advice stays in words: a padding that changes a mean loss is refused, not offered); a diff that stays
    offered unverified fails here, naming the rule, the script and the reason. The captures are the seeded tests'
    own (only the patched copies run), and each rule's diff is checked once: the same rule builds its diff the same
    way on every script, and a check per script and rule would cost the suite minutes. host_sync.py's rules are
    checked by its ``--verify`` profile (the test above), not a second time here."""
    from tpu_agent.profile.api import diagnose
    from tpu_agent.profile.options import ProfileOptions
    from tpu_agent.runtime.api import LaunchTarget

    monkeypatch.chdir(SCRIPTS)  # the copy verification makes is the scripts' folder, not the repository
    checked: dict[str, tuple[str, str]] = {}
    # host_sync.py (the first seeded script) was profiled with --verify for the test above: its rules' diffs were
    # checked there, by the profile itself, each once; their verdicts count here as that script's checks
    first_script = SEEDED[0]
    assert first_script[0] == "host_sync.py" and not first_script[2]
    _, verified_report, _ = captures.get("host_sync.py", verify=True)
    _offered_diffs_are_verified(verified_report)
    for found in verified_report["findings"]:
        verdict = (found["agent_change"] or {}).get("verification")
        if verdict and verdict["status"] != "not_checked" and found["rule_id"] not in checked:
            checked[found["rule_id"]] = ("host_sync.py", f"{verdict['status']}: {verdict['reason']}")
    assert checked, verified_report["findings"]  # host_sync.py offers diffs (HS-1, PR-1): none was checked
    scripts = [*dict.fromkeys((script, options) for script, _, options in SEEDED), ("well_tuned.py", ())]
    # Captured last to first (checked below first to last, as before): test_seeded_profile.py takes the same
    # captures first to last, so when it runs beside this test on another worker, each runs about half of them
    # instead of one waiting for the other's (this test starts first and is the suite's longest: its tail).
    for script, options in reversed(scripts):
        captures.get(script, *options)
    for script, options in scripts:
        logdir, report, _ = captures.get(script, *options)
        diagnosis = diagnose(logdir)
        diagnosis.exit_code = report["capture"]["exit_code"]
        first = [
            f
            for f in diagnosis.findings
            if f.agent_change is not None and f.agent_change.diff and f.rule_id not in checked
        ]
        first = [f for i, f in enumerate(first) if f.rule_id not in {g.rule_id for g in first[:i]}]
        if not first:
            continue
        if script == "well_tuned.py":
            pytest.fail(f"the tuned script offers diffs: {[f.rule_id for f in first]}")
        diagnosis.findings = first
        flags = dict(zip(options[::2], options[1::2], strict=True))
        settings = ProfileOptions(
            steps=3, warmup=1, chip=flags.get("--chip", "v6e"), eager_mode=flags.get("--eager-mode"), verify=True
        )
        verify.verify_diagnosis(diagnosis, LaunchTarget(str(SCRIPTS / script), []), settings, 1.0)
        for finding in first:
            change = finding.agent_change
            assert change is not None and change.verification is not None
            checked[finding.rule_id] = (script, f"{change.verification.status}: {change.verification.reason}")
            if change.verification.status == "failed":
                assert change.diff is None and change.verification.reason, finding.rule_id
            else:
                assert change.diff and change.verified, (finding.rule_id, script, change.verification)
    assert any(place[1].startswith("verified") for place in checked.values()), checked


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("import torch\nfor step in range(3):\n    total += loss.item()\n", encoding="utf-8")
    return path


def test_a_diff_applies_only_where_its_context_matches(tmp_path: Path) -> None:
    path = _script(tmp_path)
    diff = patches.replace_on_line(str(path), 3, r"\.item\(\)", ".detach()")
    assert diff is not None
    text = path.read_text(encoding="utf-8")
    assert unidiff.apply_diff(text, diff) == text.replace(".item()", ".detach()")
    with pytest.raises(unidiff.DiffError, match="does not apply at line 3"):
        unidiff.apply_diff(text.replace("total +=", "total -="), diff)


def test_the_copy_stays_inside_the_folder(tmp_path: Path) -> None:
    """Untrusted folder: a symlink out of it is not followed (file or directory); one inside it is copied."""
    root, outside, dest = tmp_path / "project", tmp_path / "secret", tmp_path / "copy"
    root.mkdir()
    outside.mkdir()
    (outside / "key.txt").write_text("secret", encoding="utf-8")
    _script(root)
    (root / "leak.txt").symlink_to(outside / "key.txt")
    (root / "leakdir").symlink_to(outside, target_is_directory=True)
    (root / "alias.py").symlink_to(root / "train.py")
    (root / "__pycache__").mkdir()
    verify.copy_folder(root, dest, set())
    assert sorted(p.name for p in dest.iterdir()) == ["alias.py", "train.py"]
    assert not (dest / "alias.py").is_symlink()


def test_losses_must_match_within_the_bound() -> None:
    assert verify.check_losses([1.0, 2.0], [1.00005, 2.0], precision=False) == ""
    assert "step 0 changed" in verify.check_losses([1.0], [1.01], precision=False)
    assert verify.check_losses([1.0], [1.01], precision=True) == ""  # bfloat16's bound for a precision change
    assert "no loss" in verify.check_losses([1.0], [], precision=False)
    assert verify.check_losses([], [], precision=False) == ""  # nothing to compare: the reason says so elsewhere
    nan = float("nan")
    assert "step 0 changed" in verify.check_losses([nan], [1.0], precision=False)  # a NaN matches nothing
    assert "step 0 changed" in verify.check_losses([nan], [nan], precision=False)


def test_stored_verdicts_are_reapplied_and_a_tampered_one_is_not(tmp_path: Path) -> None:
    """diagnose reads verified.json back: a failed verdict keeps the diff withdrawn; a verdict that names another
    diff than the capture's own, or a "verified" one naming none, is ignored (the diff stays, marked not checked)."""
    from tpu_agent.profile.model import AgentChange, Evidence, Finding, Severity

    def finding(title: str) -> Finding:
        return Finding(
            "HS-1", "scalar read", "host sync", Severity.warning, title, Evidence("m", 1.0, 0.5), [], "s",
            AgentChange("d", "--- a/x\n+++ b/x\n"), 1.0, 0.5,
        )  # fmt: skip

    class Holder:
        findings = [finding("one"), finding("two"), finding("three"), finding("four")]
        verification = None

    failed = Verification("failed", "the loss of step 0 changed")
    stored = {
        "summary": {"enabled": True},
        "findings": {
            "HS-1\0one": {"diff": "--- a/x\n+++ b/x\n", "verification": failed.__dict__},
            "HS-1\0two": {"diff": "--- a/other\n", "verification": Verification("verified", "ok").__dict__},
            "HS-1\0four": {"diff": None, "verification": Verification("verified", "ok").__dict__},
        },
    }
    (tmp_path / "verified.json").write_text(json.dumps(stored), encoding="utf-8")
    holder = Holder()
    verify.recall(tmp_path, holder)  # type: ignore[arg-type]
    one, two, three, four = (f.agent_change for f in holder.findings)
    assert one is not None and one.diff is None and one.verification == failed
    assert two is not None and two.diff and two.verification is not None and two.verification.status == "not_checked"
    assert three is not None and three.verification == verify.NOT_RUN
    assert four is not None and four.diff and four.verification == verify.NOT_RUN  # "verified" naming no diff


def test_a_verdict_is_recalled_from_another_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Diffs name their file relative to the working directory: a diagnose (an MCP server, another shell) run from
    elsewhere than the profile that verified a diff still finds the verdict for the same file and hunks, and not for
    the same hunks in another file."""
    from tpu_agent.profile.model import AgentChange, Evidence, Finding, Severity

    hunk = "@@ -3 +3 @@\n-    total += loss.item()\n+    total += loss.detach()\n"

    def holder(title: str, path: str, verification: Verification | None) -> Any:
        change = AgentChange("d", f"--- a/{path}\n+++ b/{path}\n{hunk}", verification=verification)
        found = Finding(
            "HS-1", "scalar read", "host sync", Severity.warning, title, Evidence("m", 1.0, 0.5), [], "s", change, 1.0, 0.5
        )  # fmt: skip

        class Holder:
            findings = [found]
            verification: dict[str, Any] | None = {"enabled": True}

        return Holder()

    (tmp_path / "project" / "src").mkdir(parents=True)
    checked = Verification("verified", "the patched copy ran", "host syncs per step", 1.0, 0.0)
    monkeypatch.chdir(tmp_path / "project")
    verify.save(tmp_path, holder("same", "src/train.py", checked))  # type: ignore[arg-type]
    monkeypatch.chdir(tmp_path)
    again = holder("same", "project/src/train.py", None)
    verify.recall(tmp_path, again)
    assert again.findings[0].agent_change.verification == checked
    other = holder("same", "project/src/eval.py", None)
    verify.recall(tmp_path, other)
    assert other.findings[0].agent_change.verification == verify.NOT_RUN


def test_mcp_diagnose_items_carry_the_verdict(tmp_path: Path) -> None:
    """tpu_diagnose's items say whether agent_diff was verified, and why (the same sentence the reports print)."""
    from tpu_agent.plugins.tools.diagnose import _item_from_finding
    from tpu_agent.plugins.workspace import Workspace

    checked = Verification("verified", "the patched copy ran", "host syncs per step", 1.0, 0.0)
    data = {
        "rule_id": "HS-1", "name": "n", "category": "host sync", "severity": "warning", "title": "t",
        "suggestion": "s", "locations": [], "estimated_saving_pct": 1.0,
        "agent_change": {"description": "d", "diff": "--- a/x\n", "verified": True, "verification": checked.__dict__},
    }  # fmt: skip
    item = _item_from_finding(data, Workspace(tmp_path, "argument"))
    assert item.diff_verified and item.agent_diff == "--- a/x\n"
    assert item.verification == "Verified (host syncs per step 1 -> 0): the patched copy ran."
    withheld = {**data, "agent_change": {"description": "d", "diff": None, "verified": False,
                                         "verification": Verification("failed", "the loss changed").__dict__}}  # fmt: skip
    item = _item_from_finding(withheld, Workspace(tmp_path, "argument"))
    assert not item.diff_verified and item.agent_diff is None and "the loss changed" in (item.verification or "")


def test_the_finding_read_again_is_the_one_at_the_same_place() -> None:
    """classifier_syncs.py: with print(loss) fixed, the HS-2 left is the .cpu() site's, not the print's (the check
    once took it for the print's and withheld a diff that worked)."""
    from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, Severity

    printed = Finding(
        "HS-2", "copy", "host sync", Severity.warning, "t", Evidence("host syncs per step", 1.0, 0.5),
        [Location("train.py", 43, "main", code="print(loss)")], "s", AgentChange("d", "diff"), 1.0, 0.5,
    )  # fmt: skip
    other = {"rule_id": "HS-2", "locations": [{"line": 46, "code": "history.append(loss.cpu())"}]}
    wrapped = {"rule_id": "HS-2", "locations": [{"line": 44, "code": "print(loss)"}]}
    edited = {"rule_id": "HS-2", "locations": [{"line": 43, "code": "print(loss.detach())"}]}
    assert verify._same_finding(printed, [other]) is None
    assert verify._same_finding(printed, [other, wrapped]) is wrapped
    assert verify._same_finding(printed, [edited]) is edited
    # a diff that put a line above 43: the print is now at 44 (gone there), and the site that moved onto line 43 is
    # another one, not this finding left standing
    diff = "--- a/train.py\n+++ b/train.py\n@@ -40,1 +40,2 @@\n x = 1\n+y = 2\n"
    assert unidiff.moved_lines(diff, 43) == {44} and unidiff.moved_lines(diff, 40) == {40}
    shifted = {"rule_id": "HS-2", "locations": [{"line": 43, "code": "history.append(loss.cpu())"}]}
    assert verify._same_finding(printed, [shifted], unidiff.moved_lines(diff, 43)) is None
    replaced = (
        "--- a/train.py\n+++ b/train.py\n@@ -43,1 +43,2 @@\n-print(loss)\n+value = loss.detach()\n+print(value)\n"
    )
    assert unidiff.moved_lines(replaced, 43) == {43, 44} and unidiff.moved_lines(replaced, 45) == {46}
    inserted = "--- a/train.py\n+++ b/train.py\n@@ -2,0 +3 @@\n+import os\n"
    assert unidiff.moved_lines(inserted, 2) == {2} and unidiff.moved_lines(inserted, 3) == {4}


@pytest.mark.parametrize(
    ("options", "capture_s", "module", "reason"),
    [
        ({"verify": False}, 1.0, False, "verification is off (--no-verify)"),
        ({"verify": True, "verify_capture_limit_s": 60.0}, 61.0, False, "the capture took 61 s, over the 60 s limit"),
        ({"verify": True}, 1.0, True, "runs as a module (-m)"),
    ],
)
def test_verification_that_does_not_run_says_why_and_keeps_the_diff_marked(
    tmp_path: Path, options: dict, capture_s: float, module: bool, reason: str
) -> None:  # type: ignore[type-arg]
    """Opt-out, a capture over the limit and a module target cost nothing: no run, each diff marked not checked."""
    from tpu_agent.profile.model import AgentChange, Evidence, Finding, Severity
    from tpu_agent.profile.options import ProfileOptions
    from tpu_agent.runtime.api import LaunchTarget

    class Holder:
        findings = [
            Finding("HS-1", "n", "host sync", Severity.warning, "t", Evidence("m", 1.0, 0.5), [], "s",
                    AgentChange("d", "--- a/x\n+++ b/x\n"), 1.0, 0.5)
        ]  # fmt: skip
        exit_code = 0

    holder = Holder()
    target = LaunchTarget("pkg.train" if module else str(tmp_path / "train.py"), [], is_module=module)
    summary = verify.verify_diagnosis(holder, target, ProfileOptions(**options), capture_s)  # type: ignore[arg-type]
    change = holder.findings[0].agent_change
    assert change is not None and change.diff and change.verification is not None
    assert change.verification.status == "not_checked" and reason in change.verification.reason
    assert not summary["enabled"] and reason in summary["skipped"] and summary["verified"] == 0


def _holder(
    diff: str, code: str = "", evidence: object = None, window: int = 3, losses: tuple[float, ...] = (1.0, 2.0, 3.0)
) -> object:
    """A diagnosis of one finding offering ``diff`` (the script exited 0, its ``losses`` recorded)."""
    from tpu_agent.profile.model import AgentChange, Evidence, Finding, Location, Severity

    recorded = list(losses)

    class Primary:
        losses = recorded

        @staticmethod
        def steps_in_window() -> list[int]:
            return list(range(window))

    class Model:
        primary = Primary()

    class Holder:
        findings = [
            Finding("HS-1", "n", "host sync", Severity.warning, "t", evidence or Evidence("m", 1.0, 0.5),
                    [Location("train.py", 3, "main", code=code)], "s", AgentChange("d", diff), 1.0, 0.5)
        ]  # fmt: skip
        exit_code = 0
        model = Model()

    return Holder()


def _verdict(holder: object, script: Path) -> Verification:
    from tpu_agent.profile.options import ProfileOptions
    from tpu_agent.runtime.api import LaunchTarget

    verify.verify_diagnosis(holder, LaunchTarget(str(script), []), ProfileOptions(verify=True), 1.0)  # type: ignore[arg-type]
    change = holder.findings[0].agent_change  # type: ignore[attr-defined]
    assert change.verification is not None
    return change.verification  # type: ignore[no-any-return]


def test_a_folder_over_the_copy_limits_leaves_the_diff_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder's size is not the diff's fault: the diff stays, marked not checked with the reason (it was
    withdrawn as failed)."""
    path = _script(tmp_path)
    (tmp_path / "data.txt").write_text("x", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(verify, "MAX_COPY_FILES", 1)
    diff = patches.replace_on_line(str(path), 3, r"\.item\(\)", ".detach()")
    assert diff is not None
    holder = _holder(diff)
    verdict = _verdict(holder, path)
    assert verdict.status == "not_checked" and "more than 1 files" in verdict.reason
    assert holder.findings[0].agent_change.diff == diff  # type: ignore[attr-defined]


def test_the_copy_is_the_project_the_script_was_run_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tpu-agent profile scripts/train.py --config configs/x.yaml` from the project: the copy holds configs/ and
    runs from the project's place in it; a scratch folder inside the project is not copied into itself; /, home
    and the temp folder are refused, and then the script's own folder is copied."""
    from tpu_agent.profile.options import ProfileOptions
    from tpu_agent.runtime.api import LaunchTarget

    (tmp_path / "scripts").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "x.yaml").write_text("lr: 1\n", encoding="utf-8")
    script = _script(tmp_path / "scripts")
    monkeypatch.chdir(tmp_path)
    copy = verify._Copy(LaunchTarget(str(script), []), ProfileOptions(), tmp_path / "scratch")
    assert copy.root == tmp_path.resolve() and copy.cwd == Path(".") and copy.script == Path("scripts/train.py")
    assert (copy.pristine / "configs" / "x.yaml").is_file() and not (copy.pristine / "scratch").exists()
    import tempfile

    for folder in (Path(tempfile.gettempdir()), Path.home(), Path("/")):
        with pytest.raises(verify.NotChecked, match="too wide"):
            verify.check_root(folder.resolve())
    # run from / (too wide): the script's own folder is copied instead, run from its root
    monkeypatch.chdir("/")
    copy = verify._Copy(LaunchTarget(str(script), []), ProfileOptions(), tmp_path / "scratch2")
    assert copy.root == script.parent.resolve() and copy.cwd == Path(".") and copy.script == Path("train.py")


@pytest.mark.parametrize(("unpatched_runs", "status"), [(True, "failed"), (False, "not_checked")])
def test_a_patched_run_that_fails_is_blamed_on_the_diff_only_when_the_unpatched_copy_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unpatched_runs: bool, status: str
) -> None:
    """The profiled run itself is replaced (no subprocess): the patched script exits 1; the unpatched copy, run
    only then, exits 0 (the diff broke it: failed) or 1 too (the script cannot run from a copy: not checked)."""
    path = _script(tmp_path)
    monkeypatch.chdir(tmp_path)
    runs: list[bool] = []

    def profiled(script: Path, args: list[str], cwd: Path, options: object, logdir: Path) -> dict:  # type: ignore[type-arg]
        patched = ".detach()" in script.read_text(encoding="utf-8")
        runs.append(patched)
        assert cwd == script.parent
        return {"capture": {"exit_code": 1 if patched or not unpatched_runs else 0, "losses": []}, "findings": []}

    monkeypatch.setattr(verify, "run_patched", profiled)
    diff = patches.replace_on_line(str(path), 3, r"\.item\(\)", ".detach()")
    assert diff is not None
    holder = _holder(diff)
    verdict = _verdict(holder, path)
    assert runs == [True, False] and verdict.status == status
    assert ("unpatched copy runs" if unpatched_runs else "even unpatched (it exited with code 1)") in verdict.reason
    assert bool(holder.findings[0].agent_change.diff) == (status == "not_checked")  # type: ignore[attr-defined]


@pytest.mark.parametrize(("after", "status"), [(5, "failed"), (2, "verified")])
def test_a_count_over_the_window_is_compared_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: int, status: str
) -> None:
    """SH-1 counts distinct shape sets over the window: 10 in 10 steps, then 5 in the patched run's 5 steps is the
    same rate (the diff did nothing: failed, where the raw count once 'verified' it); 2 in 5 is fewer per step."""
    from tpu_agent.profile.model import Evidence

    path = _script(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = "total += loss.item()"

    def profiled(script: Path, args: list[str], cwd: Path, options: object, logdir: Path) -> dict:  # type: ignore[type-arg]
        capture = {"exit_code": 0, "losses": [1.0, 2.0, 3.0], "window": {"first_step": 2, "last_step": 6}}
        left = {"rule_id": "HS-1", "locations": [{"line": 3, "code": code}], "evidence": {"value": after}}
        return {"capture": capture, "findings": [left]}

    monkeypatch.setattr(verify, "run_patched", profiled)
    diff = patches.replace_on_line(str(path), 3, r"\.item\(\)", ".detach()")
    assert diff is not None
    verdict = _verdict(_holder(diff, code, Evidence("distinct shape sets", 10, 1, "shape sets"), window=10), path)
    assert verdict.status == status and verdict.metric == "distinct shape sets per step", verdict
    assert (verdict.before, verdict.after) == (1.0, after / 5)
    assert f"a count over the window: 10 in 10 steps, {after} in 5 when patched" in verdict.reason


def test_a_nan_loss_is_null_in_the_json_report(tmp_path: Path) -> None:
    """A script whose loss went NaN: the JSON report is still JSON (null there; a bare NaN was written before)."""
    from tpu_agent.profile.api import diagnose
    from tpu_agent.profile.layout import CAPTURE_FILE, raw_dir
    from tpu_agent.profile.report import render
    from tpu_agent.profile.synthetic import write_capture

    write_capture(tmp_path, steps=5)
    record_path = raw_dir(tmp_path) / CAPTURE_FILE.format(rank=0)
    record = json.loads(record_path.read_text(encoding="utf-8"))
    record_path.write_text(json.dumps({**record, "losses": [1.0, float("nan")]}), encoding="utf-8")

    def no_nan(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON report")

    report = json.loads(render(diagnose(tmp_path), "json"), parse_constant=no_nan)
    assert report["capture"]["losses"] == [1.0, None]


def test_a_nan_loss_before_the_patch_leaves_the_diff_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to compare a patched run's losses with: the diff is not run, and kept, marked not checked."""
    path = _script(tmp_path)
    monkeypatch.chdir(tmp_path)
    diff = patches.replace_on_line(str(path), 3, r"\.item\(\)", ".detach()")
    assert diff is not None
    verdict = _verdict(_holder(diff, losses=(1.0, float("nan"))), path)
    assert verdict.status == "not_checked" and "loss of step 1 is not a number" in verdict.reason


def test_the_patched_run_keeps_the_users_hooks_but_not_the_capture_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child profile adds its own capture hook after the user's, as the first capture did; only the event
    folder (the child makes its own) is dropped (the user's hooks were dropped too)."""
    from tpu_agent.profile.layout import HOOK_SPEC
    from tpu_agent.profile.options import ProfileOptions
    from tpu_agent.runtime.envvars import EVENTS_DIR_ENV, HOOKS_ENV

    monkeypatch.setenv(HOOKS_ENV, f"mine.hooks:setup,{HOOK_SPEC}")
    monkeypatch.setenv(EVENTS_DIR_ENV, "/somewhere")
    env = verify.child_env(ProfileOptions())
    assert env[HOOKS_ENV] == "mine.hooks:setup" and EVENTS_DIR_ENV not in env
    monkeypatch.delenv(HOOKS_ENV)
    assert HOOKS_ENV not in verify.child_env(ProfileOptions())


def test_an_interrupted_check_stops_the_patched_runs_whole_group(tmp_path: Path) -> None:
    """Ctrl-C while a patched run is waited for: the exception goes on and the child's process group (a rank it
    started included) is gone, not orphaned with its temp copy."""
    import os
    import signal
    import sys

    started = tmp_path / "pid"
    child = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(started)!r}, 'w').write(str(p.pid)); time.sleep(60)"

    def interrupt(signum: int, frame: object) -> None:
        if started.exists() and started.read_text(encoding="utf-8"):  # Ctrl-C once the child has started its rank
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)
    try:
        with pytest.raises(KeyboardInterrupt):
            verify.run_bounded([sys.executable, "-S", "-c", child], tmp_path, dict(os.environ), 30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    stat = Path(f"/proc/{int(started.read_text(encoding='utf-8'))}/stat")

    def running() -> bool:  # gone, or a zombie its new parent has not reaped yet: either way no longer running
        try:
            return stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    import time

    deadline = time.monotonic() + 5  # SIGKILL was sent; the kernel ends the process asynchronously
    while running() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running()
