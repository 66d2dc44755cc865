"""Packed buffers a captured graph only reads through views (FSDP2's flat gradient buffers) are given one input
per view before the graph is compiled for a slice, so the compiler shards each tensor as a rank holds it."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from tpu_agent.estimate import views

aten = torch.ops.aten


def _graph(build: Any, placeholders: int) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    inputs = [graph.placeholder(f"input{i}") for i in range(placeholders)]
    graph.output(build(graph, inputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _reads_two_views(graph: torch.fx.Graph, inputs: list[torch.fx.Node]) -> tuple[torch.fx.Node, ...]:
    """What an optimizer reads of FSDP2's flat gradient buffer: two tensors packed one after the other."""
    buffer, weight = inputs
    first = graph.call_function(aten.as_strided_copy.default, (buffer, [2, 2], [2, 1], 0))
    second = graph.call_function(aten.as_strided_copy.default, (buffer, [2, 4], [4, 1], 4))
    return graph.call_function(aten.add.Tensor, (first, weight)), graph.call_function(aten.mul.Tensor, (second, 2.0))


def test_a_packed_buffer_read_through_views_becomes_one_input_per_view_computing_the_same() -> None:
    gm = _graph(_reads_two_views, 2)
    described = [((12,), torch.float32, 7), ((2, 2), torch.float32, 8)]
    unpacked, inputs = views.unpacked(gm, described)
    assert inputs == [((2, 2), torch.float32, 7), ((2, 4), torch.float32, 7), ((2, 2), torch.float32, 8)]
    buffer, weight = torch.arange(12.0), torch.full((2, 2), 0.5)
    expected = gm(buffer, weight)
    got = unpacked(buffer[:4].view(2, 2), buffer[4:].view(2, 4), weight)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert [n.op for n in gm.graph.nodes].count("placeholder") == 2  # the captured graph itself is unchanged


def test_a_buffer_written_read_whole_or_through_overlapping_views_keeps_its_one_input() -> None:
    def written(graph: torch.fx.Graph, inputs: list[torch.fx.Node]) -> tuple[torch.fx.Node, ...]:
        view = graph.call_function(aten.as_strided_copy.default, (inputs[0], [2, 2], [2, 1], 0))
        return (graph.call_function(aten.copy_.default, (inputs[0], inputs[1])), view)

    def overlapping(graph: torch.fx.Graph, inputs: list[torch.fx.Node]) -> tuple[torch.fx.Node, ...]:
        return tuple(
            graph.call_function(aten.as_strided_copy.default, (inputs[0], [2, 2], [2, 1], offset)) for offset in (0, 2)
        )

    def whole(graph: torch.fx.Graph, inputs: list[torch.fx.Node]) -> tuple[torch.fx.Node, ...]:
        return (graph.call_function(aten.as_strided_copy.default, (inputs[0], [3, 4], [4, 1], 0)),)

    def transposed(graph: torch.fx.Graph, inputs: list[torch.fx.Node]) -> tuple[torch.fx.Node, ...]:
        return tuple(
            graph.call_function(aten.as_strided_copy.default, (inputs[0], [2, 2], [1, 2], offset)) for offset in (0, 4)
        )

    described = [((12,), torch.float32, 7), ((12,), torch.float32, 8)]
    for build in (written, overlapping, whole, transposed):
        gm = _graph(build, 2)
        assert views.unpacked(gm, described) == (gm, described), build.__name__
