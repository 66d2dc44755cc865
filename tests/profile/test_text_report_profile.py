"""The terminal report at 80 columns and wider: findings in a short table, each fix below it as a block of its
own whose diff lines stay whole (not folded into table cells)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpu_agent.profile.api import diagnose
from tpu_agent.profile.report.text import CONTINUATION, render_text
from tpu_agent.profile.synthetic import SCRIPT_LINES, write_capture

LONG = "    total = total + loss.detach()  # accumulate on the device; read it once per log interval, not every step"


def _report(tmp_path: Path, monkeypatch) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    lines = [f"x{i} = {i}" for i in range(1, 21)]
    lines[SCRIPT_LINES["forward"] - 2] = "for x in loader:"
    lines[SCRIPT_LINES["forward"] - 1] = "    loss = model(x).square().mean()"
    lines[SCRIPT_LINES["forward"]] = LONG
    (tmp_path / "train.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_capture(tmp_path, steps=6, script=tmp_path / "train.py")
    return diagnose(tmp_path).to_dict()


def _diff_lines(data: dict[str, Any]) -> list[str]:
    diffs = [(f.get("agent_change") or {}).get("diff") for f in data["findings"]]
    lines = [line.rstrip() for diff in diffs if diff for line in diff.splitlines()]
    assert any(line.startswith("+") and "torch.autocast" in line for line in lines)  # PR-1's fix is among them
    return lines


@pytest.mark.parametrize("width", [80, 140])
def test_fixes_follow_the_table_with_whole_diff_lines(tmp_path: Path, monkeypatch, width: int) -> None:  # type: ignore[no-untyped-def]
    data = _report(tmp_path, monkeypatch)
    output = [line.rstrip() for line in render_text(data, width=width).splitlines()]
    assert max(len(line) for line in output if not line.startswith(("-", "+", " "))) <= width
    table_end = next(i for i, line in enumerate(output) if line.startswith("└"))
    assert all(len(line) <= width for line in output[: table_end + 1])
    assert not any("autocast" in line or "---" in line for line in output[: table_end + 1])  # no fix in a cell
    for number, finding in enumerate(data["findings"], start=1):  # each fix under its number, with file:line
        where = finding["locations"][0]
        header = f"[{number}] {finding['rule_id']} {finding['name']} at train.py:{where['line']}"
        assert any(line.startswith(header) for line in output[table_end:]), header
    for line in _diff_lines(data):
        if len(line) <= width:
            assert line in output[table_end:], line  # a whole line of its own, not split across cells
        else:  # wider than the terminal: wrapped, each continuation marked, nothing cropped
            first = next(i for i, text in enumerate(output) if line.startswith(text) and len(text) > width // 2)
            pieces = [output[first]]
            for text in output[first + 1 :]:
                if not text.startswith(CONTINUATION):
                    break
                pieces.append(text[len(CONTINUATION) :])
            assert len(pieces) > 1 and " ".join(" ".join(pieces).split()) == " ".join(line.split()), pieces
    assert not any("│" in line for line in output[table_end + 1 :] if line.startswith(("+", "-", "@@")))


def test_the_long_context_line_only_wraps_when_narrow(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = _report(tmp_path, monkeypatch)
    assert " " + LONG in _diff_lines(data)  # the PR-1 diff shows the long line as context
    assert " " + LONG in render_text(data, width=140).splitlines()
    assert " " + LONG not in render_text(data, width=80).splitlines()
