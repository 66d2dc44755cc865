"""The walks that skip the insides of atoms (whitespace, brackets, the parentheses of a name) must still reach every
other node: :func:`~tpu_agent.migrate.cstnodes.walk` (which builds nothing) and
:class:`~tpu_agent.migrate.cstnodes.TreeReader` enter exactly the nodes a libcst visitor stopping at the atoms
enters, on every fixture input."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from tpu_agent.migrate.cstnodes import ATOMS, TreeReader, walk

FIXTURES = Path(__file__).parent / "fixtures"


class _Entered(cst.CSTVisitor):
    def __init__(self, stop_at_atoms: bool) -> None:
        super().__init__()
        self.stop_at_atoms = stop_at_atoms
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return not (self.stop_at_atoms and type(node) in ATOMS)


class _Reader(TreeReader):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[cst.CSTNode] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.nodes.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        self.nodes.append(node)


def test_walks_that_skip_atoms_reach_every_other_node() -> None:
    inputs = sorted(FIXTURES.glob("*.in.py"))
    assert len(inputs) > 50
    for path in inputs:
        module = cst.parse_module(path.read_text(encoding="utf-8"))
        entered = _Entered(stop_at_atoms=True)
        module.visit(entered)
        assert sorted(map(id, walk(module))) == sorted(map(id, entered.nodes)), path.name
        everything = _Entered(stop_at_atoms=False)
        module.visit(everything)
        reached = set(map(id, entered.nodes))
        skipped = [node for node in everything.nodes if id(node) not in reached]
        assert all(type(node) not in (cst.Name, cst.Call, cst.SimpleString) for node in skipped), path.name
        reader = _Reader()
        module.visit(reader)
        expected = [node for node in entered.nodes if type(node) in (cst.Name, cst.Call)]
        assert sorted(map(id, reader.nodes)) == sorted(map(id, expected)), path.name
