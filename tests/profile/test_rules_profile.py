"""Rules, loader and estimate on synthetic captures with known answers; rules without data say so."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tpu_agent.chips import get_chip
from tpu_agent.errors import TpuAgentError
from tpu_agent.profile.api import diagnose
from tpu_agent.profile.estimate import estimate
from tpu_agent.profile.layout import raw_dir
from tpu_agent.profile.load import load_raw
from tpu_agent.profile.model import ProfileModel, RankProfile, RunConfig, Status, Step
from tpu_agent.profile.rules import ALL_RULES, get_rule, run_rules
from tpu_agent.profile.rules._base import CATEGORIES
from tpu_agent.profile.rules.sh_mxu_alignment import waste
from tpu_agent.profile.synthetic import write_capture


def test_every_rule_is_described() -> None:
    """The catalogue itself is derived from the package (tests/profile/test_catalogue_profile.py)."""
    for rule in ALL_RULES.values():
        assert rule.name and rule.rationale and rule.before and rule.after and rule.references
        assert rule.category in CATEGORIES
    assert get_rule("hs-1").code == "HS-1"
    with pytest.raises(TpuAgentError):
        get_rule("XX-9")


def test_synthetic_capture_findings_and_numbers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("\n".join(f"line {i}" for i in range(1, 30)) + "\n", encoding="utf-8")
    write_capture(tmp_path, steps=40, script=script)
    diagnosis = diagnose(tmp_path)
    found = {f.rule_id: f for f in diagnosis.findings}
    assert set(found) == {"HS-1", "SH-2", "PR-1"}
    assert (found["HS-1"].locations[0].file, found["HS-1"].locations[0].line) == (str(script), 16)
    assert found["HS-1"].evidence.value == 1.0 and found["HS-1"].evidence.steps == tuple(range(2, 40))
    assert found["SH-2"].evidence.value == pytest.approx(waste((200, 200), 128), abs=1e-3)  # 1 - 200^2/256^2
    data = diagnosis.to_dict()
    assert data["step_time"] == {"count": 38, "median_ms": 4.0, "mean_ms": 4.0, "min_ms": 4.0, "max_ms": 4.0}
    # Per step: 2*64*200*200 + 2*64*200*100 forward, 2*64*100*200 + 2*200*64*200 backward.
    flops = 2 * 64 * 200 * 200 + 2 * 64 * 200 * 100 + 2 * 64 * 100 * 200 + 2 * 200 * 64 * 200
    assert diagnosis.estimate.flops_per_step == flops
    chip = get_chip("v5e")
    assert diagnosis.estimate.fused_step_s >= flops / chip.peak_bf16_flops_per_device
    assert 0 < diagnosis.estimate.fused_mfu <= 1 and 0 < diagnosis.estimate.eager_mfu <= diagnosis.estimate.fused_mfu
    assert json.loads((tmp_path / "tpu-agent" / "report.json").read_text())["schema_version"] == 1


def test_chip_override_changes_the_tile(tmp_path: Path) -> None:
    write_capture(tmp_path, steps=10, hidden=128, out=128)
    on_v5e = {f.rule_id for f in diagnose(tmp_path, chip="v5e").findings}
    on_v6e = {f.rule_id for f in diagnose(tmp_path, chip="v6e").findings}
    assert "SH-2" not in on_v5e  # a 128x128 weight fills v5e's 128 tile
    assert "SH-2" in on_v6e  # but pads to 256x256 on v6e: 75 % of its MXU work is padding


def test_rules_without_data_report_insufficient_data() -> None:
    rank = RankProfile(rank=0, steps=[Step(i, i * 10, i * 10 + 10, "xspace") for i in range(5)])
    model = ProfileModel(config=RunConfig(chip=get_chip("v6e"), source="xspace"), ranks={0: rank})
    findings, outcomes = run_rules(model)
    status = {o.rule_id: o for o in outcomes}
    assert status["CAP-1"].status == Status.ok
    for rule_id in ("HS-1", "HS-2", "SH-1", "SH-2", "PR-1", "IP-1", "EM-1", "EM-2", "CO-1", "SD-1"):
        assert status[rule_id].status == Status.insufficient_data, rule_id
        assert status[rule_id].reason
    assert findings == []


def test_no_steps_is_an_error_and_gates_step_rules() -> None:
    model = ProfileModel(
        config=RunConfig(chip=get_chip("v6e"), source="xspace", script="infer.py"), ranks={0: RankProfile(rank=0)}
    )
    findings, outcomes = run_rules(model)
    assert [f.rule_id for f in findings] == ["CAP-1"] and findings[0].severity.value == "error"
    assert {o.rule_id for o in outcomes if o.status == Status.insufficient_data} >= {"CAP-2", "CAP-3", "HS-1", "IP-1"}


def test_estimate_unavailable_without_op_trace() -> None:
    rank = RankProfile(rank=0, steps=[Step(0, 0, 10, "xspace")])
    result = estimate(ProfileModel(config=RunConfig(chip=get_chip("v7")), ranks={0: rank}))
    assert not result.available and result.assumptions


def test_damaged_event_log_is_a_clear_error(tmp_path: Path) -> None:
    write_capture(tmp_path, steps=5)
    with open(raw_dir(tmp_path) / "events-rank0.jsonl", "a", encoding="utf-8") as handle:
        handle.write("{not json\n")
    with pytest.raises(TpuAgentError) as error:
        load_raw(raw_dir(tmp_path))
    assert "events-rank0.jsonl:" in error.value.message


def test_diagnose_missing_logdir(tmp_path: Path) -> None:
    with pytest.raises(TpuAgentError) as error:
        diagnose(tmp_path / "nope")
    assert error.value.code == "no-logdir"
    with pytest.raises(TpuAgentError) as error:
        diagnose(tmp_path)
    assert error.value.code == "no-capture"


def _rank_with(events: list, steps: int = 6) -> RankProfile:
    return RankProfile(
        rank=0, steps=[Step(i, i * 1_000_000, (i + 1) * 1_000_000, "optimizer") for i in range(steps)], events=events
    )


def _model(rank: RankProfile, eager_mode: str | None) -> ProfileModel:
    return ProfileModel(
        config=RunConfig(chip=get_chip("v6e"), eager_mode=eager_mode, source="tpu-agent"), ranks={0: rank}
    )


def test_fused_eager_fragmentation_and_unstable_graphs_name_their_sites() -> None:
    from tpu_agent.runtime import events as ev

    site = ev.Site("train.py", 21, "<module>")
    other = ev.Site("train.py", 30, "<module>")
    records = []
    for step in range(6):
        t = step * 1_000_000
        records += [
            ev.Flush(t + 10 * k, 0, step, cause="item", graph_ops=5, graph_hash="a", duration_ns=5, site=site)
            for k in range(7)
        ]
        if step == 4:
            records.append(
                ev.Flush(t + 500, 0, step, cause="print", graph_ops=9, graph_hash="new", duration_ns=5, site=other)
            )
    findings, _ = run_rules(_model(_rank_with(records), "DEFER_AND_FUSE"))
    by_id = {f.rule_id: f for f in findings}
    assert by_id["EM-2"].evidence.value == pytest.approx(43 / 6, abs=0.01)
    assert (by_id["EM-2"].locations[0].file, by_id["EM-2"].locations[0].line) == ("train.py", 21)
    assert by_id["EM-4"].evidence.steps == (4,) and by_id["EM-4"].locations[0].line == 30
    # The same capture in Strict eager: fused-eager rules have nothing to say.
    findings, _ = run_rules(_model(_rank_with(records), "DEFER_NEVER"))
    assert not {"EM-2", "EM-4"} & {f.rule_id for f in findings}


def test_recompiles_after_warmup_are_errors_with_the_guard() -> None:
    from tpu_agent.runtime import events as ev

    site = ev.Site("train.py", 8, "step_fn")
    records = [
        ev.Compile(
            step * 1_000_000 + 5,
            0,
            step,
            function="step_fn",
            graph_id=step,
            graph_ops=10,
            is_recompile=step > 0,
            reason="tensor 'x' size mismatch at index 1. expected 32, actual 39" if step else "first call",
            duration_ns=10,
            site=site,
        )
        for step in range(6)
    ]
    findings, _ = run_rules(_model(_rank_with(records), "DEFER_NEVER"))
    co1 = next(f for f in findings if f.rule_id == "CO-1")
    assert co1.severity.value == "error" and "size mismatch" in co1.title and co1.locations[0].line == 8
    assert "pad or bucket" in co1.suggestion


def test_rediagnosis_rewrites_its_own_session_and_drops_stale_xprof_caches(tmp_path: Path) -> None:
    write_capture(tmp_path, steps=10)
    first = diagnose(tmp_path).xplane_paths
    session = first[0].parent
    (session / "ALL_HOSTS.op_stats_v2.pb").write_bytes(b"stale")
    second = diagnose(tmp_path, chip="v6e").xplane_paths
    assert first == second and [p.name for p in session.parent.iterdir()] == [session.name]
    assert not (session / "ALL_HOSTS.op_stats_v2.pb").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plugins", "tpu-agent"]


def test_debug_mode_left_on_is_a_capture_error_ranked_first(tmp_path: Path) -> None:
    write_capture(tmp_path, steps=10)
    model = load_raw(raw_dir(tmp_path))
    model.config.eager_mode = "DEFER_NEVER_AND_LAUNCH_BLOCKING"
    model.config.env = {"XLA_FLAGS": "--xla_dump_to=/tmp/hlo"}
    findings, _ = run_rules(model)
    assert findings[0].rule_id == "CAP-6" and findings[0].severity.value == "error"
    assert "DEFER_NEVER_AND_LAUNCH_BLOCKING" in findings[0].title and "--xla_dump_to" in findings[0].title
    model.config.eager_mode, model.config.env = "DEFER_NEVER", {}
    assert "CAP-6" not in {f.rule_id for f in run_rules(model)[0]}


def test_tiny_layer_padding_is_a_bounded_share() -> None:
    """A Linear(8, 8) on v6e's 256 tile: 1023/1024 of its MXU work is padding, reported as 99.9 %, not 102300 %."""
    from tpu_agent.profile.model import Weight
    from tpu_agent.runtime.events import Site

    rank = RankProfile(rank=0, steps=[Step(i, i * 1_000_000, (i + 1) * 1_000_000, "optimizer") for i in range(4)])
    rank.weights = [Weight("fc", "Linear", (8, 8), "float32", Site("model.py", 3, "Net.__init__"))]
    model = ProfileModel(config=RunConfig(chip=get_chip("v6e")), ranks={0: rank})
    (finding,) = get_rule("SH-2").check(model)
    assert "99.9% of its MXU work" in finding.title and finding.evidence.value == pytest.approx(1023 / 1024, abs=1e-4)
    percents = [float(p) for p in re.findall(r"(\d+(?:\.\d+)?)%", finding.title + finding.suggestion)]
    assert percents and all(0 <= p <= 100 for p in percents)


def test_ranks_that_never_ran_a_collective_trained_alone() -> None:
    from tpu_agent.runtime import events as ev

    step_site = ev.Site("train.py", 14, "<module>")

    def run(world: int, collectives: bool, source: str = "optimizer") -> list:
        ranks = {}
        for index in range(world):
            records = [ev.Collective(5, index, 0, "all_reduce", 64, world, 10, step_site)] if collectives else []
            rank = RankProfile(
                rank=index,
                steps=[Step(i, i * 1_000_000, (i + 1) * 1_000_000, source) for i in range(4)],
                events=records,
            )
            rank.step_site = step_site
            ranks[index] = rank
        config = RunConfig(chip=get_chip("v6e"), world_size=world, source="tpu-agent")
        return [f for f in run_rules(ProfileModel(config=config, ranks=ranks))[0] if f.rule_id == "SD-7"]

    (alone,) = run(2, collectives=False)
    assert alone.title.startswith("None of the 2 ranks ran a collective")
    assert (alone.locations[0].file, alone.locations[0].line) == ("train.py", 14)
    assert "DistributedDataParallel" in alone.suggestion and alone.agent_change is not None
    assert run(2, collectives=True) == []  # DDP, FSDP or an all_reduce joined them
    assert run(1, collectives=False) == []  # one process has nobody to average with
    assert run(2, collectives=False, source="annotation") == []  # inference steps: no gradients to average


def test_memory_that_grows_every_step_is_traced_to_what_the_loop_keeps(tmp_path: Path) -> None:
    """SD-8: memory left allocated at each step's end that rises every step (memory_growth.py: 0.69 MiB a step)
    points at the append that keeps each step's loss with its graph, and the diff appends it detached; flat or
    noisy memory is no finding."""
    from tpu_agent.runtime import events as ev

    script = tmp_path / "train.py"
    script.write_text(
        "losses = []\nfor step in range(10):\n    loss = model(x).sum()\n    loss.backward()\n"
        "    optimizer.step()\n    losses.append(loss)\n",
        encoding="utf-8",
    )

    def run(resident: list[int]) -> list:
        rank = RankProfile(rank=0, steps=[Step(i, i * 1_000_000, (i + 1) * 1_000_000, "optimizer") for i in range(6)])
        rank.step_site = ev.Site(str(script), 5, "<module>")
        rank.events = [
            ev.MemorySample(i * 1_000_000 + 900_000, 0, i, value, 2 * value) for i, value in enumerate(resident)
        ]
        rank.has_memory_trace = True
        config = RunConfig(chip=get_chip("v6e"), source="tpu-agent")
        return [f for f in run_rules(ProfileModel(config=config, ranks={0: rank}))[0] if f.rule_id == "SD-8"]

    (growing,) = run([10 << 20, 11 << 20, 12 << 20, 13 << 20, 14 << 20, 15 << 20])
    assert growing.evidence.value == 1 << 20 and [loc.line for loc in growing.locations] == [6, 5]
    assert growing.agent_change is not None and growing.agent_change.diff is not None
    assert "+    losses.append(loss.detach())" in growing.agent_change.diff
    assert run([10 << 20] * 6) == [] and run([10 << 20, 12 << 20, 11 << 20, 13 << 20, 12 << 20, 14 << 20]) == []


def test_the_varying_input_of_a_batch_is_preferred_to_a_collate_s_flat_lengths() -> None:
    """collate_pad_sequence.py: pad_sequence's concatenated 1-D lengths vary first in each step; the [batch, length]
    tensor the model gets is what SH-1 must pad (padding dim 0 of the flat one was the diff verification refused)."""
    from tpu_agent.profile.model import Op
    from tpu_agent.profile.rules.sh_dynamic_shapes import _first_varying_input

    def step(length: int) -> list[Op]:
        return [
            Op("aten::cat", 0, 1, 0, input_shapes=[[8 * length - 3]]),
            Op("aten::_to_copy", 2, 1, 0, input_shapes=[[8, length]]),
        ]

    assert _first_varying_input({0: step(40), 1: step(52)}) == (2, 1, [40, 52])
    flat_only = {i: [Op("aten::cat", 0, 1, 0, input_shapes=[[n]])] for i, n in enumerate((5, 9))}
    assert _first_varying_input(flat_only) == (1, 0, [5, 9])


def test_a_step_that_runs_fewer_matmuls_on_the_same_shapes_is_no_shape_change() -> None:
    """A layer frozen for two steps, then unfrozen: its weight-gradient matmul is missing from those steps, but no
    op sees a new shape (SH-1 once counted those steps as shape changes); a new batch size is one."""
    from tpu_agent.profile.model import Op

    def run(last_batch: int) -> list:
        rank = RankProfile(rank=0, steps=[Step(i, i * 1_000_000, (i + 1) * 1_000_000, "optimizer") for i in range(6)])
        for i in range(6):
            batch = last_batch if i == 5 else 32
            forward = Op("aten::mm", i * 1_000_000 + 10, 10, 0, [[batch, 128], [128, 128]], step=i)
            weight_grad = Op("aten::mm", i * 1_000_000 + 30, 10, 0, [[128, batch], [batch, 128]], step=i)
            rank.ops += [forward] + ([weight_grad] if i >= 2 else [])
        rank.has_op_trace = True
        model = ProfileModel(config=RunConfig(chip=get_chip("v6e"), source="tpu-agent"), ranks={0: rank})
        return get_rule("SH-1").check(model)

    assert run(32) == []
    (changed,) = run(24)
    assert changed.evidence.steps == (5,) and changed.evidence.value == 2


def test_a_model_inside_a_compiled_region_has_its_changing_input_named_by_sh1(tmp_path: Path) -> None:
    """issue_churn.py's shape: the model runs inside a compiled lambda, so no forward call is seen; SH-1 takes the
    tensor's line and the value that sizes it from the recompiles' guard (it once had no location at all)."""
    from tpu_agent.profile.model import Op
    from tpu_agent.runtime import events as ev

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        'step_fn = torch.compile(lambda t: t.float().sum(), backend="tpu")\n'
        "for step in range(6):\n"
        "    seq = 10 + step\n"
        "    tokens = torch.randint(0, 5, (8, seq))\n"
        "    loss = step_fn(tokens)\n",
        encoding="utf-8",
    )
    site = ev.Site(str(script), 2, "<lambda>")
    rank = RankProfile(rank=0, steps=[Step(i, i * 1_000_000, (i + 1) * 1_000_000, "optimizer") for i in range(6)])
    rank.ops = [Op("aten::mm", i * 1_000_000 + 10, 10, 0, [[8, 10 + i], [10 + i, 4]], step=i) for i in range(6)]
    rank.has_op_trace = True
    rank.events = [
        ev.Compile(i * 1_000_000 + 5, 0, i, "<lambda>", i, 3, True,
                   f"tensor 't' size mismatch at index 1. expected {9 + i}, actual {10 + i}", 10, site)
        for i in range(1, 6)
    ]  # fmt: skip
    config = RunConfig(chip=get_chip("v6e"), source="tpu-agent", script=str(script))
    (finding,) = get_rule("SH-1").check(ProfileModel(config=config, ranks={0: rank}))
    assert [(loc.file, loc.line) for loc in finding.locations[:2]] == [(str(script), 5), (str(script), 4)]
