"""The engine's two shortcuts must never change a result: the file prefilter (a file with no CUDA-ish token is
not parsed) and the reduced parse (inert top-level statements are stubbed before libcst parses the file).

Both are checked against the slow path on the fixture inputs and on a sample of the real-shaped tree
(benchmarks/real_tree.py), for both targets: a dismissed file gets nothing from a full run, and the reduced
parse gives the same output text and the same findings, at the same positions, as the full parse.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from tpu_agent.migrate.engine.gate import reduce_source
from tpu_agent.migrate.engine.prefilter import CUDA_TOKENS, lower_search, may_need_migration
from tpu_agent.migrate.engine.pypass import PyOutcome, _outcome, rewrite
from tpu_agent.migrate.engine.worker import dispatch
from tpu_agent.migrate.model import MigrateOptions, Target
from tpu_agent.migrate.rules import ALL_RULES

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from real_tree import make_tree  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
TARGETS = [Target.ACCELERATOR, Target.TPU]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    """(name, text) of every fixture input and of the Python files of a small real-shaped tree."""
    root = make_tree(tmp_path_factory.mktemp("gates") / "tree", files=30, mean_lines=100, seed=7)
    paths = sorted(FIXTURES.glob("*.in.py")) + sorted(root.rglob("*.py"))
    return [(path.name, path.read_text(encoding="utf-8")) for path in paths]


def _full(source: str, options: MigrateOptions) -> PyOutcome:
    outcome = _outcome(rewrite(source, options, ALL_RULES, dispatch(), ast.parse(source)))
    assert outcome is not None  # a full parse always has one
    return outcome


def test_lower_cased_search_is_the_case_insensitive_search(sources: list[tuple[str, str]]) -> None:
    """The prefilter lower-cases the text instead of compiling with ``re.IGNORECASE`` (four times faster): the
    pattern must be written in lower case, and the two searches must find the same match in mixed-case text."""
    assert CUDA_TOKENS.pattern == CUDA_TOKENS.pattern.lower()
    folded = re.compile(CUDA_TOKENS.pattern, re.IGNORECASE)
    samples = [text.encode() for _, text in sources] + [
        b"x = Torch.CUDA.is_available()",
        b"os.environ['NCCL_DEBUG']",
        b"scaler = GradScaler()",
        "d\u00e9vice = 'Cuda:0'  # \u00c9".encode(),
        b"x.to(torch.BFloat16)",
        b"m.HALF()",
        b"x.To(LOCAL_RANK)",
        b"nothing here at all",
    ]
    for data in samples + [data.swapcase() for data in samples]:
        expected, found = folded.search(data), lower_search(CUDA_TOKENS, data)
        assert (found and found.span()) == (expected and expected.span()), data[:80]


@pytest.mark.parametrize("target", TARGETS, ids=[t.value for t in TARGETS])
def test_prefilter_dismisses_only_files_a_full_run_leaves_alone(sources: list[tuple[str, str]], target: Target) -> None:
    options = MigrateOptions(target=target, unsafe_fixes=True)
    dismissed = [(name, text) for name, text in sources if not may_need_migration(text.encode())]
    assert dismissed, "the sample should hold plain files for the prefilter to dismiss"
    for name, text in dismissed:
        outcome = _full(text, options)
        assert outcome.code is None and not outcome.findings, (name, outcome.findings[:3])


@pytest.mark.slow  # two libcst passes over every input, for both targets
@pytest.mark.parametrize("target", TARGETS, ids=[t.value for t in TARGETS])
def test_reduced_parse_gives_the_full_parse_result(sources: list[tuple[str, str]], target: Target) -> None:
    options = MigrateOptions(target=target, unsafe_fixes=True)
    reduced_files = 0
    for name, text in sources:
        if not may_need_migration(text.encode()):
            continue
        tree = ast.parse(text)
        reduction = reduce_source(text, tree)
        if reduction is None:
            continue
        reduced_files += 1
        assert reduction.text.count("\n") == text.count("\n"), name  # every line keeps its number
        ast.parse(reduction.text)
        result = rewrite(text, options, ALL_RULES, dispatch(), tree, reduce=True)
        assert result.reduced, name
        reduced = _outcome(result)
        if reduced is None:  # the engine falls back to the full parse: nothing to compare
            continue
        full = _full(text, options)
        assert reduced.code == full.code, name
        assert reduced.findings == full.findings, name
    assert reduced_files >= 15


def test_stubs_keep_lines_line_endings_and_statement_kinds() -> None:
    source = (
        '"""Doc."""\r\nimport torch\r\n\r\n@decorated\r\ndef plain(a):\r\n    return a  # note\r\n'
        "x = 1; y = 2\r\nz = torch.ones(1).cuda()\r\n"
    )
    reduction = reduce_source(source, ast.parse(source))
    assert reduction is not None
    assert reduction.text == (
        '"""Doc."""\r\nimport torch\r\n\r\nif (\r\n\r\n): pass\r\n()\r\nz = torch.ones(1).cuda()\r\n'
    )
    kinds = [type(stmt).__name__ for stmt in reduction.tree.body]
    assert kinds == ["Expr", "Import", "If", "Expr", "Assign"]


def test_reduced_parse_drops_unused_cuda_imports_without_a_full_pass() -> None:
    """A CUDA import the rewrite leaves unused is dropped from a parse of the spliced output of the reduced module
    (not by migrating the file again from its full parse), with the full parse's result."""
    source = (
        "import torch\nfrom torch.cuda.amp import autocast\n\n\ndef plain(x):\n    return x + 1\n\n\n"
        "def f(model, x):\n    with autocast():\n        return model(x)\n"
    )
    for target in TARGETS:
        options = MigrateOptions(target=target)
        result = rewrite(source, options, ALL_RULES, dispatch(), ast.parse(source), reduce=True)
        assert result.reduced  # ``plain`` is a stub
        reduced = _outcome(result)
        assert reduced is not None and reduced.code is not None
        assert "torch.cuda" not in reduced.code and "def plain(x):\n    return x + 1\n" in reduced.code
        full = _full(source, options)
        assert (reduced.code, reduced.findings) == (full.code, full.findings)
