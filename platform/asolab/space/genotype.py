"""Genotype: the discrete architecture of a normal and a reduction cell.

A genotype is an immutable value. Each cell type holds one entry per
intermediate node; an entry lists that node's incoming edges as ``(op, input)``
pairs, where input 0 and 1 are the cell's two inputs and input ``k >= 2`` is
intermediate node ``k - 2``. ``*_concat`` lists the states concatenated into
the cell's output.

The canonical form sorts each node's edges by ``(input, op)``, so genotypes
that differ only in edge order are equal, hash alike and print alike. The
canonical string is readable and parses back::

    normal: sep_conv_3x3(0) skip_connect(1) | dil_conv_3x3(0) sep_conv_3x3(2) -> 2,3 ;
    reduce: max_pool_3x3(0) max_pool_3x3(1) | skip_connect(2) max_pool_3x3(0) -> 2,3

Distance between two genotypes: the number of edge positions ``(cell, node,
input)`` whose operations differ, a missing edge counting as different, plus
one per cell type whose concat list differs. It is a Hamming distance over the
union of positions, hence a metric (zero only for equal genotypes, symmetric,
triangle inequality). One op swap counts 1; moving an edge to another input
counts 2.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

Edge = tuple[str, int]
Node = tuple[Edge, ...]
CELL_TYPES = ("normal", "reduce")


def _canonical_nodes(nodes: Iterable[Iterable[Sequence[Any]]]) -> tuple[Node, ...]:
    return tuple(tuple(sorted(((str(op), int(i)) for op, i in node), key=lambda e: (e[1], e[0]))) for node in nodes)


@dataclass(frozen=True)
class Genotype:
    """The discrete architecture: normal and reduction cells as node edge lists."""

    normal: tuple[Node, ...]
    normal_concat: tuple[int, ...]
    reduce: tuple[Node, ...]
    reduce_concat: tuple[int, ...]

    def __post_init__(self) -> None:
        for cell in CELL_TYPES:
            nodes = _canonical_nodes(getattr(self, cell))
            object.__setattr__(self, cell, nodes)
            object.__setattr__(self, f"{cell}_concat", tuple(int(c) for c in getattr(self, f"{cell}_concat")))
            for k, node in enumerate(nodes):
                if not node:
                    raise ValueError(f"genotype {cell} node {k} has no edges")
                for op, i in node:
                    if not 0 <= i < k + 2:
                        raise ValueError(f"genotype {cell} node {k} reads input {i}; allowed 0..{k + 1}")

    # ------------------------------------------------------------------ views

    def cell(self, kind: str) -> tuple[Node, ...]:
        return getattr(self, kind)

    def concat(self, kind: str) -> tuple[int, ...]:
        return getattr(self, f"{kind}_concat")

    def edges(self) -> Iterator[tuple[str, int, str, int]]:
        """Every edge as ``(cell, node, op, input)``."""
        for kind in CELL_TYPES:
            for k, node in enumerate(self.cell(kind)):
                for op, i in node:
                    yield kind, k, op, i

    @property
    def num_edges(self) -> int:
        return sum(1 for _ in self.edges())

    def replace_op(self, kind: str, node: int, input_: int, new_op: str) -> "Genotype":
        """A copy with the op of edge ``(kind, node, input_)`` swapped for ``new_op``."""
        nodes = [list(n) for n in self.cell(kind)]
        nodes[node] = [(new_op if i == input_ else op, i) for op, i in nodes[node]]
        return Genotype(**{**self._fields(), kind: tuple(tuple(n) for n in nodes)})

    def _fields(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in ("normal", "normal_concat", "reduce", "reduce_concat")}

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        return {
            "normal": [[list(e) for e in node] for node in self.normal],
            "normal_concat": list(self.normal_concat),
            "reduce": [[list(e) for e in node] for node in self.reduce],
            "reduce_concat": list(self.reduce_concat),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Genotype":
        fields = {}
        for kind in CELL_TYPES:
            nodes = data[kind]
            # Accept DARTS' flat list of (op, input) pairs, two per node.
            if nodes and isinstance(nodes[0], (list, tuple)) and isinstance(nodes[0][0], str):
                nodes = [nodes[j : j + 2] for j in range(0, len(nodes), 2)]
            fields[kind] = _canonical_nodes(nodes)
            fields[f"{kind}_concat"] = tuple(data[f"{kind}_concat"])
        return cls(**fields)

    @classmethod
    def from_json(cls, text: str) -> "Genotype":
        return cls.from_dict(json.loads(text))

    def __str__(self) -> str:
        parts = []
        for kind in CELL_TYPES:
            nodes = " | ".join(" ".join(f"{op}({i})" for op, i in node) for node in self.cell(kind))
            parts.append(f"{kind}: {nodes} -> {','.join(map(str, self.concat(kind)))}")
        return " ; ".join(parts)

    canonical = property(__str__)

    @classmethod
    def parse(cls, text: str) -> "Genotype":
        """Parse the canonical string (inverse of ``str``)."""
        fields: dict[str, Any] = {}
        for part in text.split(";"):
            m = re.fullmatch(r"\s*(normal|reduce):\s*(.*?)\s*->\s*([\d,\s]+?)\s*", part)
            if not m:
                raise ValueError(f"not a genotype string: {part.strip()!r}")
            kind, body, concat = m.groups()
            nodes = []
            for node in body.split("|"):
                edges = re.findall(r"([a-z0-9_]+)\((\d+)\)", node)
                if not edges:
                    raise ValueError(f"genotype {kind} node {node.strip()!r} has no op(input) edges")
                nodes.append([(op, int(i)) for op, i in edges])
            fields[kind] = nodes
            fields[f"{kind}_concat"] = [int(c) for c in concat.split(",")]
        if set(fields) != {"normal", "normal_concat", "reduce", "reduce_concat"}:
            raise ValueError("a genotype string needs a 'normal:' and a 'reduce:' part")
        return cls(**fields)


# ---------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class EdgeChange:
    """One position whose operations differ between two genotypes (None = no edge)."""

    cell: str
    node: int
    input: int
    before: tuple[str, ...]
    after: tuple[str, ...]

    def __str__(self) -> str:
        b = "+".join(self.before) or "-"
        a = "+".join(self.after) or "-"
        return f"{self.cell} node {self.node} input {self.input}: {b} -> {a}"


def _positions(g: Genotype) -> dict[tuple[str, int, int], tuple[str, ...]]:
    pos: dict[tuple[str, int, int], list[str]] = {}
    for kind, node, op, i in g.edges():
        pos.setdefault((kind, node, i), []).append(op)
    return {k: tuple(sorted(v)) for k, v in pos.items()}


def diff(a: Genotype, b: Genotype) -> list[EdgeChange]:
    """Edge-by-edge changes from ``a`` to ``b`` (concat lists are compared separately)."""
    pa, pb = _positions(a), _positions(b)
    return [
        EdgeChange(cell, node, i, pa.get((cell, node, i), ()), pb.get((cell, node, i), ()))
        for cell, node, i in sorted(set(pa) | set(pb), key=lambda p: (CELL_TYPES.index(p[0]), p[1], p[2]))
        if pa.get((cell, node, i), ()) != pb.get((cell, node, i), ())
    ]


def distance(a: Genotype, b: Genotype) -> int:
    """Hamming distance over edge positions (see the module docstring)."""
    concat = sum(a.concat(k) != b.concat(k) for k in CELL_TYPES)
    return len(diff(a, b)) + concat
