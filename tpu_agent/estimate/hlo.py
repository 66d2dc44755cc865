"""What the optimized HLO of a compiled TPU program says: fusions, collectives and their bytes, the costliest
matmuls, and the HBM bytes lost to the compiler's tiled layouts.

The compiler's cost analysis gives totals; the optimized HLO text gives the breakdown behind them. This module
reads that text (a stable, documented format) into :class:`HloSummary`; it never executes anything.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Bytes per element of HLO primitive types (sub-byte types count as fractions).
DTYPE_BYTES: dict[str, float] = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
    "c64": 8, "c128": 16,
}  # fmt: skip
COLLECTIVES = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "collective-broadcast",
)  # fmt: skip
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*[a-z0-9]*)\[(?P<dims>[\d,]*)\](?:\{(?P<layout>[^}]*)\})?")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<rest>.*)$")
_COMPUTATION = re.compile(r"^\s*(?P<entry>ENTRY\s+)?%(?P<name>[\w.\-]+)\s*\(.*\{\s*$")
_TILE = re.compile(r"T\((?P<tile>[\d,]+)\)")


@dataclass(frozen=True)
class ArrayShape:
    """One array in HLO: element type, logical dims and (when the compiler chose one) its tiled layout."""

    dtype: str
    dims: tuple[int, ...]
    minor_to_major: tuple[int, ...] = ()
    tile: tuple[int, ...] = ()

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def bytes(self) -> float:
        return self.elements * DTYPE_BYTES.get(self.dtype, 4)

    @property
    def padded_bytes(self) -> float:
        """Bytes the tiled layout occupies: the most-minor dims rounded up to the tile, as stored in HBM."""
        if not self.tile or not self.dims or not self.minor_to_major:
            return self.bytes
        padded = list(self.dims)
        for tile_size, dim in zip(reversed(self.tile), self.minor_to_major, strict=False):
            padded[dim] = -(-padded[dim] // tile_size) * tile_size
        return math.prod(padded) * DTYPE_BYTES.get(self.dtype, 4)


def parse_arrays(type_text: str) -> list[ArrayShape]:
    """Every array in an HLO type (a single array or a tuple of them)."""
    arrays = []
    for match in _ARRAY.finditer(type_text):
        if match.group("dtype") not in DTYPE_BYTES:
            continue
        dims = tuple(int(d) for d in match.group("dims").split(",") if d)
        layout = match.group("layout") or ""
        order_text, _, tiling = layout.partition(":")
        minor_to_major = tuple(int(d) for d in order_text.split(",") if d.strip().isdigit())
        tile_match = _TILE.search(tiling)
        tile = tuple(int(t) for t in tile_match.group("tile").split(",")) if tile_match else ()
        arrays.append(ArrayShape(match.group("dtype"), dims, minor_to_major, tile))
    return arrays


@dataclass(frozen=True)
class Instruction:
    """One HLO instruction: its name, result type, opcode, operand names and attribute text."""

    computation: str
    in_entry: bool
    name: str
    type_text: str
    opcode: str
    operands: tuple[str, ...]
    attributes: str

    @property
    def arrays(self) -> list[ArrayShape]:
        return parse_arrays(self.type_text)

    @property
    def op_name(self) -> str:
        """The framework op this instruction came from (``metadata={op_name=...}``), when recorded."""
        match = re.search(r'op_name="([^"]*)"', self.attributes)
        return match.group(1) if match else ""


def _split_type_and_call(rest: str) -> tuple[str, str, str] | None:
    """``f32[2]{0} add(%a, %b), metadata=...`` -> (type, opcode, text after the opcode)."""
    if rest.startswith("("):
        depth = 0
        for index, char in enumerate(rest):
            depth += char == "("
            depth -= char == ")"
            if depth == 0:
                type_text, remainder = rest[: index + 1], rest[index + 1 :].lstrip()
                break
        else:
            return None
    else:
        type_text, _, remainder = rest.partition(" ")
    opcode, paren, call = remainder.partition("(")
    if not paren:
        return None
    return type_text, opcode.strip(), call


def _operands_and_attributes(call: str) -> tuple[tuple[str, ...], str]:
    depth = 1
    for index, char in enumerate(call):
        depth += char == "("
        depth -= char == ")"
        if depth == 0:
            operand_text, attributes = call[:index], call[index + 1 :]
            return tuple(re.findall(r"%([\w.\-]+)", operand_text)), attributes
    return (), call


def parse_instructions(hlo_text: str) -> Iterator[Instruction]:
    """Every instruction of every computation in an HLO module's text."""
    computation, in_entry = "", False
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header and "=" not in line.split("(", 1)[0]:
            computation, in_entry = header.group("name"), bool(header.group("entry"))
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        split = _split_type_and_call(match.group("rest"))
        if split is None:
            continue
        type_text, opcode, call = split
        operands, attributes = _operands_and_attributes(call)
        yield Instruction(computation, in_entry, match.group("name"), type_text, opcode, operands, attributes)


def _matmul_flops(instruction: Instruction, shapes: dict[str, ArrayShape]) -> float:
    """2 x output elements x contracted size, for ``dot`` and (the TPU compiler's form of matmuls) ``convolution``."""
    out = instruction.arrays
    lhs = shapes.get(instruction.operands[0]) if instruction.operands else None
    if not out or lhs is None:
        return 0.0
    if instruction.opcode == "dot":
        match = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instruction.attributes)
        contracted = math.prod(lhs.dims[int(d)] for d in match.group(1).split(",") if d) if match else 1
        return 2.0 * out[0].elements * contracted
    labels = re.search(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->", instruction.attributes)
    if not labels or "f" not in labels.group(1) or len(labels.group(1)) != len(lhs.dims):
        return 0.0
    features = lhs.dims[labels.group(1).index("f")]
    groups = re.search(r"feature_group_count=(\d+)", instruction.attributes)
    window = re.search(r"window=\{size=([\dx]+)", instruction.attributes)
    window_size = math.prod(int(s) for s in window.group(1).split("x")) if window else 1
    return 2.0 * out[0].elements * features / (int(groups.group(1)) if groups else 1) * window_size


@dataclass(frozen=True)
class CollectiveOp:
    kind: str
    bytes: float
    op_name: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "bytes": self.bytes, "op_name": self.op_name}


@dataclass(frozen=True)
class MatmulOp:
    name: str
    flops: float
    shape: str
    op_name: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "flops": self.flops, "shape": self.shape, "op_name": self.op_name}


@dataclass
class HloSummary:
    """The breakdown of one compiled program that the totals of the cost analysis do not show."""

    fusions: int = 0
    collectives: list[CollectiveOp] = field(default_factory=list)
    matmuls: list[MatmulOp] = field(default_factory=list)
    logical_bytes: float = 0.0  # arrays the entry computation holds, as the program defines them
    padded_bytes: float = 0.0  # the same arrays in the compiler's tiled layouts

    @property
    def collective_bytes(self) -> float:
        return sum(op.bytes for op in self.collectives)

    @property
    def layout_padding_fraction(self) -> float:
        """Share of the entry computation's array bytes that is tile padding (0 when nothing was padded)."""
        return 0.0 if self.padded_bytes <= 0 else max(0.0, 1.0 - self.logical_bytes / self.padded_bytes)

    def top_matmuls(self, count: int = 5) -> list[MatmulOp]:
        return sorted(self.matmuls, key=lambda op: op.flops, reverse=True)[:count]

    def collectives_by_kind(self) -> dict[str, dict[str, float]]:
        kinds: dict[str, dict[str, float]] = {}
        for op in self.collectives:
            entry = kinds.setdefault(op.kind, {"count": 0, "bytes": 0.0})
            entry["count"] += 1
            entry["bytes"] += op.bytes
        return kinds

    def to_dict(self) -> dict[str, Any]:
        return {
            "fusions": self.fusions,
            "collectives": self.collectives_by_kind(),
            "collective_bytes": self.collective_bytes,
            "top_matmuls": [op.to_dict() for op in self.top_matmuls()],
            "layout_padding_fraction": self.layout_padding_fraction,
        }


def summarize(hlo_text: str) -> HloSummary:
    """Read an optimized HLO module's text into an :class:`HloSummary`."""
    summary = HloSummary()
    shapes: dict[str, dict[str, ArrayShape]] = {}
    instructions = list(parse_instructions(hlo_text))
    for instruction in instructions:
        arrays = instruction.arrays
        if len(arrays) == 1:
            shapes.setdefault(instruction.computation, {})[instruction.name] = arrays[0]
    for instruction in instructions:
        local = shapes.get(instruction.computation, {})
        opcode = instruction.opcode.removesuffix("-start")
        if instruction.opcode == "fusion":
            summary.fusions += 1
        if opcode in COLLECTIVES and not instruction.opcode.endswith("-done"):
            operand_bytes = sum(local[o].bytes for o in instruction.operands if o in local)
            output_bytes = max((array.bytes for array in instruction.arrays), default=0.0)
            summary.collectives.append(CollectiveOp(opcode, max(operand_bytes, output_bytes), instruction.op_name))
        if instruction.opcode in ("dot", "convolution"):
            flops = _matmul_flops(instruction, local)
            if flops:
                summary.matmuls.append(
                    MatmulOp(instruction.name, flops, instruction.type_text.split("{")[0], instruction.op_name)
                )
        if instruction.in_entry and instruction.opcode not in ("tuple", "get-tuple-element", "bitcast"):
            for array in instruction.arrays:
                summary.logical_bytes += array.bytes
                summary.padded_bytes += array.padded_bytes
    return summary
