"""Pins the one use of libcst internals (``engine/positions.py``) to libcst's public API.

The engine computes finding positions by running libcst's private code generation with a recording state;
these tests compare the result with the public ``PositionProvider`` and ``Module.code_for_node`` over every
Python fixture, so a libcst release that changes ``CodegenState`` or ``_codegen`` fails here, by name.
"""

from __future__ import annotations

import libcst as cst
import pytest
from conftest import FIXTURES
from libcst.metadata import MetadataWrapper, PositionProvider

from tpu_agent.migrate.engine.gate import statement_map
from tpu_agent.migrate.engine.positions import layout, positions, statement_positions
from tpu_agent.migrate.engine.pypass import rewrite
from tpu_agent.migrate.engine.worker import dispatch
from tpu_agent.migrate.model import MigrateOptions
from tpu_agent.migrate.rules import ALL_RULES

SOURCES = sorted(FIXTURES.glob("*.in.py"))
EXTRA = [
    "import torch\r\nx = torch.zeros(1).cuda()\r\n",  # CRLF
    "import torch\rx = (\r    torch.zeros(1)\r    .cuda()\r)\r",  # lone CR
    "@decorator\nclass A:\n    '''doc'''\n\n    def f(self):\n        return torch.cuda.is_available()\n",
]


def _texts() -> list[tuple[str, str]]:
    return [(p.name, p.read_text(encoding="utf-8")) for p in SOURCES] + [(f"extra{i}", t) for i, t in enumerate(EXTRA)]


def _public_positions(module: cst.Module) -> dict[int, tuple[int, int, int, int]]:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    ranges = wrapper.resolve(PositionProvider)
    return {id(node): (r.start.line, r.start.column, r.end.line, r.end.column) for node, r in ranges.items()}


@pytest.mark.parametrize(("name", "source"), _texts(), ids=[name for name, _ in _texts()])
def test_positions_match_the_public_position_provider(name: str, source: str) -> None:
    module = cst.parse_module(source)
    expected = _public_positions(module)
    nodes = [node for node in _walk(module) if isinstance(node, cst.BaseExpression)]
    found, spans = positions(module, nodes, list(module.body))
    assert found == {id(node): expected[id(node)] for node in nodes}
    # the spans of the top-level statements tile the module's text, each holding what libcst generates for
    # it (the last one without the newline the module drops when the source had none)
    code = module.code
    ends = [spans[id(stmt)] for stmt in module.body]
    assert all(a[1] == b[0] for a, b in zip(ends, ends[1:], strict=False))
    for stmt in module.body:
        start, end = spans[id(stmt)]
        generated = module.code_for_node(stmt)
        assert code[start:end] == generated or (stmt is module.body[-1] and generated.startswith(code[start:end]))


@pytest.mark.parametrize(("name", "source"), _texts(), ids=[name for name, _ in _texts()])
def test_statement_positions_of_findings_match(name: str, source: str) -> None:
    """The per-statement shortcut (code generation of only the statements with findings) gives the same
    positions as the public provider over the whole module."""
    result = rewrite(source, MigrateOptions(), ALL_RULES, dispatch())
    begins = statement_map(result.module, source).begins
    placed = layout(result.module, source, begins) if begins is not None else None
    if placed is None or not result.ctx.findings:
        # Some generated sources have no statement with a finding (or no statement layout), so the shortcut
        # computes no positions for them and there is nothing to compare; hypothesis draws the rest.
        pytest.skip("no layout or no findings")
    expected = _public_positions(result.module)
    tops = {finding.top for finding in result.ctx.findings}
    # measured statements are generated whole (their length checks the layout); the others up to their last finding
    for measured in (tops, set()):
        found, lengths = statement_positions(result.module, placed, result.ctx.findings, measured)
        assert set(lengths) == measured & set(range(len(result.module.body)))
        for finding in result.ctx.findings:
            assert found[id(finding.node)] == expected[id(finding.node)], finding.code


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    out = [node]
    for child in node.children:
        out.extend(_walk(child))
    return out
