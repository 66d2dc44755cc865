"""``--min-torch``: rewrites whose emitted API is newer than the given torch are reported, not applied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import migrate_one
from test_cli_migrate import cli

from tpu_agent.migrate.model import MigrateOptions, Target, torch_version
from tpu_agent.migrate.rules import ALL_RULES

SOURCE = """import torch

x = torch.zeros(3, device="cuda")
torch.cuda.manual_seed_all(0)
peak = torch.cuda.max_memory_allocated()
"""


def test_torch_version_parses_releases_and_local_tags() -> None:
    assert torch_version("2.5") == (2, 5)
    assert torch_version("2.7.1+cu121") == (2, 7)
    assert MigrateOptions(min_torch="2.6").torch_allows("2.6")
    assert not MigrateOptions(min_torch="2.6").torch_allows("2.10")  # numeric, not lexical
    assert MigrateOptions(min_torch="2.10").torch_allows("2.9")


def test_old_torch_keeps_only_rewrites_that_exist_there(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    new = migrate_one(path)
    old = migrate_one(path, min_torch="2.5")
    assert {f.code for f in new.findings if f.fixed} >= {"TPU101", "TPU203", "TPU204"}
    fixed = {f.code: f.fixed for f in old.findings}
    # torch.manual_seed has no minimum; the resolver (2.7) and torch.accelerator memory calls (2.10) do
    assert fixed == {"TPU101": False, "TPU203": False, "TPU204": True}
    assert all("--min-torch is 2.5" in f.message for f in old.findings if not f.fixed)
    text = old.migrated_bytes.decode()
    assert "torch.manual_seed(0)" in text and 'device="cuda"' in text and "DEVICE" not in text
    # the tpu target writes literals: no resolver needed
    tpu = migrate_one(path, min_torch="2.7", target=Target.TPU)
    assert {f.code: f.fixed for f in tpu.findings}["TPU101"] is True


def test_every_recorded_since_torch_is_a_version() -> None:
    for rule in ALL_RULES.values():
        if rule.since_torch is not None:
            torch_version(rule.since_torch)


@pytest.mark.slow
def test_cli_min_torch_in_json_and_bad_value(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SOURCE)
    result = cli("migrate", "train.py", "--check", "--min-torch", "2.5", "--format", "json", cwd=tmp_path)
    report = json.loads(result.stdout)
    assert report["options"]["min_torch"] == "2.5"
    assert report["summary"]["converted"] == 1
    bad = cli("migrate", "train.py", "--check", "--min-torch", "latest", cwd=tmp_path)
    assert bad.returncode == 2 and "--min-torch" in bad.stderr and "latest" in bad.stderr
