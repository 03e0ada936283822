"""Genotype: the discrete architecture of a normal and a reduction cell,
and of every cell that has its own alphas.

A genotype is an immutable value. Each cell type holds one entry per
intermediate node; an entry lists that node's incoming edges as ``(op, input)``
pairs, where input 0 and 1 are the cell's two inputs and input ``k >= 2`` is
intermediate node ``k - 2``. ``*_concat`` lists the states concatenated into
the cell's output.

A cell inserted by growth (``deepen``) is searched with its own alphas, so it
has its own architecture: ``own_cells`` holds ``(cell_index, nodes, concat)``
for each such cell, ``cell_index`` being its position in the network's cells;
it is named ``cellN`` (``N`` = that index) in strings, edges and diffs. A
genotype without own cells (the usual case) is exactly the classic two-cell
genotype: same fields, JSON and string.

The canonical form sorts each node's edges by ``(input, op)`` and the own
cells by index, so genotypes that differ only in edge order are equal, hash
alike and print alike. The canonical string is readable and parses back::

    normal: sep_conv_3x3(0) skip_connect(1) | dil_conv_3x3(0) sep_conv_3x3(2) -> 2,3 ;
    reduce: max_pool_3x3(0) max_pool_3x3(1) | skip_connect(2) max_pool_3x3(0) -> 2,3

with one more part per own cell, e.g. ``; cell4: sep_conv_3x3(0) skip_connect(1) |
skip_connect(0) sep_conv_3x3(2) -> 2,3``.

Distance between two genotypes: the number of edge positions ``(cell, node,
input)`` whose operations differ, a missing edge counting as different, plus
one per cell whose concat list differs (a cell only one of the two genotypes
has counts as differing). It is a Hamming distance over the union of
positions, hence a metric (zero only for equal genotypes, symmetric, triangle
inequality). One op swap counts 1; moving an edge to another input counts 2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .ops import PARAMETER_FREE

Edge = tuple[str, int]
Node = tuple[Edge, ...]
OwnCell = tuple[int, tuple[Node, ...], tuple[int, ...]]  # (cell index, nodes, concat)
CELL_TYPES = ("normal", "reduce")
_OWN_NAME = re.compile(r"cell(\d+)")


def own_cell_name(index: int) -> str:
    """The name of the own-alpha cell at ``index``: its alpha key, plan key and
    the cell name in genotype strings, edges and diffs."""
    return f"cell{index}"


def own_cell_index(name: str) -> int | None:
    """The index in an own-cell name (``cell4`` -> 4); None for a cell type."""
    m = _OWN_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def cell_order(name: str) -> tuple[int, int]:
    """Sort key of cell names: normal, reduce, then own cells by index."""
    index = own_cell_index(name)
    return (CELL_TYPES.index(name), 0) if index is None else (len(CELL_TYPES), index)


def _canonical_nodes(nodes: Iterable[Iterable[Sequence[Any]]]) -> tuple[Node, ...]:
    return tuple(
        tuple(sorted(((str(op), int(i)) for op, i in node), key=lambda e: (e[1], e[0])))
        for node in nodes
    )


def _nodes_from(nodes: Sequence[Any]) -> tuple[Node, ...]:
    # Accept DARTS' flat list of (op, input) pairs, two per node.
    if nodes and isinstance(nodes[0], (list, tuple)) and isinstance(nodes[0][0], str):
        nodes = [nodes[j : j + 2] for j in range(0, len(nodes), 2)]
    return _canonical_nodes(nodes)


@dataclass(frozen=True)
class Genotype:
    """The discrete architecture: normal and reduction cells as node edge lists,
    plus ``(cell_index, nodes, concat)`` for each cell with its own alphas."""

    normal: tuple[Node, ...]
    normal_concat: tuple[int, ...]
    reduce: tuple[Node, ...]
    reduce_concat: tuple[int, ...]
    own_cells: tuple[OwnCell, ...] = ()

    def __post_init__(self) -> None:
        for cell in CELL_TYPES:
            object.__setattr__(self, cell, _canonical_nodes(getattr(self, cell)))
            object.__setattr__(
                self, f"{cell}_concat", tuple(int(c) for c in getattr(self, f"{cell}_concat"))
            )
        own = tuple(
            sorted(
                (int(i), _canonical_nodes(nodes), tuple(int(c) for c in concat))
                for i, nodes, concat in self.own_cells
            )
        )
        indices = [i for i, _, _ in own]
        if len(set(indices)) != len(indices) or any(i < 0 for i in indices):
            raise ValueError(
                f"genotype own cells need distinct non-negative indices, got {indices}"
            )
        object.__setattr__(self, "own_cells", own)
        for cell in self.cell_names:
            for k, node in enumerate(self.cell(cell)):
                if not node:
                    raise ValueError(f"genotype {cell} node {k} has no edges")
                for _op, i in node:
                    if not 0 <= i < k + 2:
                        raise ValueError(
                            f"genotype {cell} node {k} reads input {i}; allowed 0..{k + 1}"
                        )

    # ------------------------------------------------------------------ views

    @property
    def cell_names(self) -> tuple[str, ...]:
        """``normal``, ``reduce`` and ``cellN`` for each own cell, in canonical order."""
        return CELL_TYPES + tuple(own_cell_name(i) for i, _, _ in self.own_cells)

    def _own(self, name: str) -> OwnCell:
        index = own_cell_index(name)
        for entry in self.own_cells:
            if entry[0] == index:
                return entry
        raise KeyError(f"genotype has no cell {name!r}; it has {', '.join(self.cell_names)}")

    def cell(self, kind: str) -> tuple[Node, ...]:
        """The nodes of a cell type or own cell (``cellN``)."""
        return getattr(self, kind) if kind in CELL_TYPES else self._own(kind)[1]

    def concat(self, kind: str) -> tuple[int, ...]:
        return getattr(self, f"{kind}_concat") if kind in CELL_TYPES else self._own(kind)[2]

    def edges(self) -> Iterator[tuple[str, int, str, int]]:
        """Every edge as ``(cell, node, op, input)``, own cells included."""
        for kind in self.cell_names:
            for k, node in enumerate(self.cell(kind)):
                for op, i in node:
                    yield kind, k, op, i

    @property
    def num_edges(self) -> int:
        return sum(1 for _ in self.edges())

    def param_free(self, kind: str) -> int:
        """The parameter-free ops (``ops.PARAMETER_FREE``) of cell ``kind``."""
        return sum(op in PARAMETER_FREE for node in self.cell(kind) for op, _ in node)

    def most_param_free(self) -> int:
        """The most parameter-free ops any one cell has."""
        return max((self.param_free(kind) for kind in self.cell_names), default=0)

    def replace_op(self, kind: str, node: int, input_: int, new_op: str) -> Genotype:
        """A copy with the op of edge ``(kind, node, input_)`` swapped for ``new_op``
        (``kind``: a cell type or an own cell's name)."""
        nodes = [list(n) for n in self.cell(kind)]
        nodes[node] = [(new_op if i == input_ else op, i) for op, i in nodes[node]]
        new_nodes = tuple(tuple(n) for n in nodes)
        if kind in CELL_TYPES:
            return Genotype(**{**self._fields(), kind: new_nodes})
        index = own_cell_index(kind)
        own = tuple((i, new_nodes if i == index else n, c) for i, n, c in self.own_cells)
        return Genotype(**{**self._fields(), "own_cells": own})

    def _fields(self) -> dict[str, Any]:
        return {
            f: getattr(self, f)
            for f in ("normal", "normal_concat", "reduce", "reduce_concat", "own_cells")
        }

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        """Plain data; ``own_cells`` only when there are any, so a two-cell
        genotype's JSON is what it always was."""
        d: dict[str, Any] = {
            "normal": [[list(e) for e in node] for node in self.normal],
            "normal_concat": list(self.normal_concat),
            "reduce": [[list(e) for e in node] for node in self.reduce],
            "reduce_concat": list(self.reduce_concat),
        }
        if self.own_cells:
            d["own_cells"] = [
                {
                    "cell": i,
                    "nodes": [[list(e) for e in node] for node in nodes],
                    "concat": list(concat),
                }
                for i, nodes, concat in self.own_cells
            ]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Genotype:
        fields: dict[str, Any] = {}
        for kind in CELL_TYPES:
            fields[kind] = _nodes_from(data[kind])
            fields[f"{kind}_concat"] = tuple(data[f"{kind}_concat"])
        fields["own_cells"] = tuple(
            (c["cell"], _nodes_from(c["nodes"]), tuple(c["concat"]))
            for c in data.get("own_cells", ())
        )
        return cls(**fields)

    @classmethod
    def from_cells(
        cls, cells: Mapping[str, Any], concat: Sequence[int] | Mapping[str, Sequence[int]]
    ) -> Genotype:
        """A genotype from its nodes per cell name (``normal``, ``reduce``, and ``cellN``
        for each own cell), and ``concat``: the nodes every cell concatenates, or those of
        each cell by name."""
        if missing := [k for k in CELL_TYPES if k not in cells]:
            raise ValueError(f"a genotype needs the cells {', '.join(missing)}")

        def joined(name: str) -> tuple[int, ...]:
            return tuple(concat[name] if isinstance(concat, Mapping) else concat)

        own = tuple(
            (own_cell_index(name), nodes, joined(name))
            for name, nodes in cells.items()
            if name not in CELL_TYPES
        )
        return cls(
            normal=cells["normal"],
            normal_concat=joined("normal"),
            reduce=cells["reduce"],
            reduce_concat=joined("reduce"),
            own_cells=own,
        )

    @classmethod
    def from_json(cls, text: str) -> Genotype:
        return cls.from_dict(json.loads(text))

    def __str__(self) -> str:
        parts = []
        for kind in self.cell_names:
            nodes = " | ".join(" ".join(f"{op}({i})" for op, i in node) for node in self.cell(kind))
            parts.append(f"{kind}: {nodes} -> {','.join(map(str, self.concat(kind)))}")
        return " ; ".join(parts)

    canonical = property(__str__)

    @classmethod
    def parse(cls, text: str) -> Genotype:
        """Parse the canonical string (inverse of ``str``)."""
        cells: dict[str, tuple[list, list[int]]] = {}
        for part in text.split(";"):
            m = re.fullmatch(r"\s*(normal|reduce|cell\d+):\s*(.*?)\s*->\s*([\d,\s]+?)\s*", part)
            if not m:
                raise ValueError(f"not a genotype string: {part.strip()!r}")
            kind, body, concat = m.groups()
            if kind in cells:
                raise ValueError(f"genotype string has two {kind!r} parts")
            nodes = []
            for node in body.split("|"):
                edges = re.findall(r"([a-z0-9_]+)\((\d+)\)", node)
                if not edges:
                    raise ValueError(
                        f"genotype {kind} node {node.strip()!r} has no op(input) edges"
                    )
                nodes.append([(op, int(i)) for op, i in edges])
            cells[kind] = (nodes, [int(c) for c in concat.split(",")])
        if not set(CELL_TYPES) <= set(cells):
            raise ValueError("a genotype string needs a 'normal:' and a 'reduce:' part")
        return cls.from_cells(
            {k: nodes for k, (nodes, _) in cells.items()},
            {k: concat for k, (_, concat) in cells.items()},
        )


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
        for cell, node, i in sorted(set(pa) | set(pb), key=lambda p: (cell_order(p[0]), p[1], p[2]))
        if pa.get((cell, node, i), ()) != pb.get((cell, node, i), ())
    ]


def distance(a: Genotype, b: Genotype) -> int:
    """Hamming distance over edge positions (see the module docstring)."""
    return len(diff(a, b)) + len(concat_changes(a, b))


def concat_changes(
    a: Genotype, b: Genotype
) -> list[tuple[str, tuple[int, ...] | None, tuple[int, ...] | None]]:
    """``(cell, before, after)`` for each cell whose concat list differs (None: the genotype
    has no such cell)."""
    names = sorted(set(a.cell_names) | set(b.cell_names), key=cell_order)
    lists = [
        (k, a.concat(k) if k in a.cell_names else None, b.concat(k) if k in b.cell_names else None)
        for k in names
    ]
    return [(k, before, after) for k, before, after in lists if before != after]
