"""The diagnostics catalogue is derived from the rules package, and every diagnostic in it is shown firing by a
fixture: a synthetic capture here, or the test named in :data:`SHOWN_BY` (a seeded script or a capture built there).

A rule module added to ``tpu_agent/profile/rules/`` joins the catalogue by itself; this module then fails until a
fixture shows the new rule firing."""

from __future__ import annotations

import ast
from collections.abc import Callable
from importlib import import_module
from pathlib import Path

import pytest
from profile_helpers import SEEDED

from tpu_agent.chips import get_chip
from tpu_agent.profile import rules as rules_package
from tpu_agent.profile.model import DataLoaderInfo, Finding, Op, ProfileModel, RankProfile, RunConfig, Step
from tpu_agent.profile.rules import ALL_RULES, FAMILIES, get_rule, order, run_rules
from tpu_agent.profile.rules._base import CATEGORIES
from tpu_agent.runtime import events as ev

HERE = Path(__file__).parent
RULE_MODULES = sorted(p.stem for p in Path(rules_package.__file__).parent.glob("[a-z]*.py"))
SITE = ev.Site("train.py", 12, "main")
STEP_NS = 1_000_000


def test_the_catalogue_is_every_rule_module_in_report_order() -> None:
    """One rule per public module of the package, none listed by hand: its code's family is the module's prefix
    (``hs_device_copy`` holds an HS rule), no code is used twice, and the order is by family, then number."""
    codes = [import_module(f"tpu_agent.profile.rules.{name}").RULE.code for name in RULE_MODULES]
    assert sorted(codes) == sorted(ALL_RULES) and len(set(codes)) == len(codes)
    for name, code in zip(RULE_MODULES, codes, strict=True):
        assert code.startswith(name.split("_")[0].upper() + "-"), (name, code)
        assert ALL_RULES[code].category in CATEGORIES
    places = [(FAMILIES.index(code.split("-")[0]), int(code.split("-")[1])) for code in ALL_RULES]
    assert places == sorted(places) and [order(rule) for rule in ALL_RULES.values()] == places


def _model(rank: RankProfile, world: int = 1, ranks: dict[int, RankProfile] | None = None) -> ProfileModel:
    config = RunConfig(chip=get_chip("v6e"), world_size=world, source="tpu-agent")
    return ProfileModel(config=config, ranks=ranks or {0: rank})


def _rank(index: int = 0, steps: int = 6, events: list[ev.Event] | None = None) -> RankProfile:
    return RankProfile(
        rank=index,
        steps=[Step(i, i * STEP_NS, (i + 1) * STEP_NS, "optimizer") for i in range(steps)],
        events=events or [],
    )


def _device_copies() -> ProfileModel:
    """HS-2: ``history.append(loss.cpu())`` every step."""
    return _model(_rank(events=[ev.HostSync(i * STEP_NS + 500, 0, i, op="cpu", site=SITE) for i in range(6)]))


def _upcasts() -> ProfileModel:
    """PR-2: a bf16 activation cast to fp32 each step (``.float()``), most of the step's bytes."""
    rank = _rank()
    for i in range(6):
        rank.ops += [
            Op("aten::_to_copy", i * STEP_NS + 10, 100, 0, [[64, 1024]], ["c10::BFloat16"], bytes=64 * 1024 * 6,
               step=i, concrete_inputs=["", "6"]),
            Op("aten::add", i * STEP_NS + 200, 100, 0, [[64, 1024]], ["float"], bytes=64 * 1024 * 4, step=i),
        ]  # fmt: skip
    rank.has_op_trace = True
    return _model(rank)


def _collective_bound() -> ProfileModel:
    """SD-2: two ranks that all-reduce for half of every step."""
    ranks = {
        r: _rank(r, events=[ev.Collective(i * STEP_NS + 10, r, i, "all_reduce", 1 << 20, 2, STEP_NS // 2, SITE)
                            for i in range(6)])
        for r in range(2)
    }  # fmt: skip
    return _model(ranks[0], world=2, ranks=ranks)


def _data_parallel() -> ProfileModel:
    """SD-6: the root module that ran is an ``nn.DataParallel``."""
    rank = _rank()
    rank.module_types = ["DataParallel"]
    rank.forward_site = SITE
    return _model(rank)


def _odd_batch() -> ProfileModel:
    """SH-3: ``DataLoader(ds, batch_size=30)``."""
    rank = _rank()
    rank.dataloaders = [DataLoaderInfo(30, 0, True, 300, SITE)]
    return _model(rank)


def _warmup_in_window() -> ProfileModel:
    """CAP-3: the window's first step takes 200 ms (a first compile), the others 10 ms."""
    rank = RankProfile(rank=0, window=(2, 7))
    starts = [0, 10, 20, 220, 230, 240, 250, 260]
    rank.steps = [Step(i, start * STEP_NS, (start + 10) * STEP_NS, "optimizer") for i, start in enumerate(starts)]
    rank.steps[2] = Step(2, 20 * STEP_NS, 220 * STEP_NS, "optimizer")
    return _model(rank)


SYNTHETIC: dict[str, Callable[[], ProfileModel]] = {
    "CAP-3": _warmup_in_window,
    "HS-2": _device_copies,
    "PR-2": _upcasts,
    "SD-2": _collective_bound,
    "SD-6": _data_parallel,
    "SH-3": _odd_batch,
}
# The rest are shown firing by these tests (file::function): seeded scripts profiled for real, or captures built there.
SHOWN_BY = {
    "CAP-1": "test_rules_profile.py::test_no_steps_is_an_error_and_gates_step_rules",
    "CAP-2": "test_jax_diagnose_profile.py::test_diagnose_jax_xspace",
    "CAP-6": "test_rules_profile.py::test_debug_mode_left_on_is_a_capture_error_ranked_first",
    "HS-1": "test_rules_profile.py::test_synthetic_capture_findings_and_numbers",
    "EM-1": "test_seeded_profile.py::test_seeded_problem_is_found_at_its_line",
    "EM-2": "test_seeded_profile.py::test_seeded_problem_is_found_at_its_line",
    "EM-3": "test_compile_fix_profile.py::test_existing_compile_switch_is_named_with_the_flag_that_turned_it_off",
    "EM-4": "test_rules_profile.py::test_fused_eager_fragmentation_and_unstable_graphs_name_their_sites",
    "CO-1": "test_seeded_profile.py::test_seeded_problem_is_found_at_its_line",
    "CO-2": "test_seeded_profile.py::test_seeded_problem_is_found_at_its_line",
    "SH-1": "test_seeded_profile.py::test_seeded_problem_is_found_at_its_line",
    "SH-2": "test_rules_profile.py::test_synthetic_capture_findings_and_numbers",
    "SH-4": "test_compiled_padding_profile.py::test_padded_dims_are_found_at_the_layer_definition",
    "PR-1": "test_rules_profile.py::test_synthetic_capture_findings_and_numbers",
    "IP-1": "test_seeded_profile.py::test_seeded_problem_is_found_at_its_line",
    "SD-1": "test_seeded_profile.py::test_seeded_problem_is_found_at_its_line",
    "SD-3": "test_compiled_hbm_profile.py::test_compiler_verdict_and_a_compiled_fix",
    "SD-4": "test_compiled_collectives_profile.py::test_small_per_chip_batch_is_collective_bound",
    "SD-7": "test_rules_profile.py::test_ranks_that_never_ran_a_collective_trained_alone",
    "SD-8": "test_rules_profile.py::test_memory_that_grows_every_step_is_traced_to_what_the_loop_keeps",
}


def test_every_diagnostic_has_a_fixture_that_shows_it_firing() -> None:
    assert set(SYNTHETIC) | set(SHOWN_BY) == set(ALL_RULES) and not set(SYNTHETIC) & set(SHOWN_BY)


@pytest.mark.parametrize("code", sorted(SHOWN_BY))
def test_the_named_test_exists_and_checks_its_rule(code: str) -> None:
    """The test :data:`SHOWN_BY` names is there, in a file that checks the rule: by its code, through the rule
    module itself (a compiled-program test calls ``RULE.check``), or as a seeded script's rule."""
    file, _, function = SHOWN_BY[code].partition("::")
    source = (HERE / file).read_text(encoding="utf-8")
    node = next((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == function), None)
    assert node is not None, SHOWN_BY[code]
    module = next(name for name in RULE_MODULES if import_module(f"tpu_agent.profile.rules.{name}").RULE.code == code)
    seeded = "SEEDED" in source and code in {rule for _, rule, _ in SEEDED}  # the seeded suite's list
    assert f'"{code}"' in source or f"tpu_agent.profile.rules.{module} import" in source or seeded, (
        f"{file} does not check {code}"
    )


@pytest.mark.parametrize("code", sorted(SYNTHETIC))
def test_the_rule_fires_on_its_synthetic_capture(code: str) -> None:
    model = SYNTHETIC[code]()
    found: list[Finding] = get_rule(code).check(model)
    assert found and all(f.rule_id == code for f in found)
    assert found[0].evidence.value >= found[0].evidence.threshold
    # through the engine too: the rule has the data it requires, and the finding is reported
    findings, outcomes = run_rules(model)
    assert next(o for o in outcomes if o.rule_id == code).status.value == "finding"
    assert code in {f.rule_id for f in findings}
