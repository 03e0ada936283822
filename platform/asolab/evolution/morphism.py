"""Function-preserving network morphisms: widen, deepen and branch.

Right after each transform the network computes the same function (in eval
mode; BatchNorm statistics are carried over), so training continues where it
was. Three layers of API:

* tensor level -- :func:`wider_mapping`, :func:`widen_conv_weight`,
  :func:`take`: Net2WiderNet on plain tensors. A mapping ``m`` of length
  ``C'`` says which old channel each new channel copies (the first ``C`` are
  the identity, the rest random replicas). Producers copy rows ``W[m]``;
  consumers copy columns and divide them by the replica count of their source
  channel, so the sum over replicas equals the old weight.
* module level -- :func:`widen_conv`, :func:`widen_bn`:
  rebuild a layer at the new width keeping stride, padding, dilation, groups,
  bias, padding mode, BN eps/momentum/affine; enough to widen any plain
  conv-BN-ReLU stack (depthwise and grouped convolutions included).
* supernet level -- :func:`widen_cell`, :func:`deepen`, :func:`add_branch`:
  each builds a new :class:`SearchNetwork` from the grown
  :class:`~asolab.space.spec.ArchSpec` and transplants every tensor of the old
  one into it (transformed where the shape changed). Because the grown network
  is exactly what ``SearchNetwork(spec)`` builds, a checkpoint of it resumes at
  its grown size by construction. :func:`remap_optimizer` then moves optimizer
  state (SGD momentum, Adam moments) onto the new parameters with the same
  transforms.

Widening a cell of the supernet changes its per-node channel count ``C``. All
states inside a cell share one mapping, because ``skip_connect`` (identity)
and the pools are channel-wise and may connect any state to any node. When a
FactorizedReduce produces the cell's channels (``preprocess0`` after a
reduction cell, ``skip_connect`` on a reduction cell's strided edges) its two
halves come from different convolutions, so the mapping is built per half
(``blocks=2``) and ``C'`` is kept even.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn as nn

from ..space.cells import SearchCell
from ..space.genotype import Genotype, own_cell_name
from ..space.network import SearchNetwork, build_on
from ..space.ops import NONE, DilConv, FactorizedReduce, Identity, Pool, ReLUConvBN, SepConv, Zero
from ..space.spec import ArchSpec, CellSpec

# A transform of one stored tensor; ``power`` is 2 for second moments (Adam's
# exp_avg_sq), whose divisor is squared so that moments scale like the weights.
Transform = Callable[[torch.Tensor, int], torch.Tensor]
SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum")

# ---------------------------------------------------------------------------- tensor level


def wider_mapping(
    old: int, new: int, *, blocks: int = 1, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Net2WiderNet mapping from ``new`` channels to ``old`` ones.

    Channels are split into ``blocks`` equal blocks widened independently (a
    grouped convolution or a FactorizedReduce needs replicas to stay in their
    block). In each block the first channels are the identity, the extra ones
    copy uniformly drawn channels of the same block.
    """
    if new < old or old % blocks or new % blocks:
        raise ValueError(f"cannot widen {old} -> {new} channels in {blocks} equal blocks")
    ob, nb = old // blocks, new // blocks
    parts = []
    for b in range(blocks):
        extra = torch.randint(0, ob, (nb - ob,), generator=generator)
        parts.append(torch.cat([torch.arange(ob), extra]) + b * ob)
    return torch.cat(parts)


def take(t: torch.Tensor, mapping: torch.Tensor | None, power: int = 1) -> torch.Tensor:
    """Rows of ``t`` along dim 0 by ``mapping`` (None: unchanged); replication needs no rescale."""
    return t.clone() if mapping is None else t[mapping.to(t.device)].clone()


def _counts(mapping: torch.Tensor, size: int) -> torch.Tensor:
    return torch.bincount(mapping, minlength=size)


def widen_conv_weight(
    w: torch.Tensor,
    *,
    groups: int = 1,
    out_map: torch.Tensor | None = None,
    in_map: torch.Tensor | None = None,
    power: int = 1,
) -> torch.Tensor:
    """Widen a conv (or linear, 2-D) weight: rows by ``out_map``, columns by
    ``in_map`` divided by the replica counts (raised to ``power``).

    A depthwise conv (``groups == in == out``) takes the same mapping on both
    sides and becomes depthwise at the new width: each new channel is a copy of
    an old one and reads one input, so nothing is divided. A grouped conv needs
    block-structured mappings (one block per group).
    """
    c_out, c_in = w.shape[0], w.shape[1] * groups
    # Mappings are host-side bookkeeping: they are checked and counted on the CPU (no
    # device sync per check) and only the final gathers run on the weight's device.
    om = out_map.cpu() if out_map is not None else None
    im = in_map.cpu() if in_map is not None else None
    dev, extra = w.device, (1,) * (w.dim() - 2)
    if groups > 1 and groups == c_out == c_in:
        if om is None and im is None:
            return w.clone()
        if om is None or im is None or not torch.equal(om, im):
            raise ValueError(
                "a depthwise convolution needs the same mapping on its input and output"
            )
        return w[om.to(dev)].clone()
    om = om if om is not None else torch.arange(c_out)
    im = im if im is not None else torch.arange(c_in)
    scale = (_counts(im, c_in).to(w.dtype) ** power).to(dev)
    if groups == 1:
        return w[om.to(dev)][:, im.to(dev)] / scale[im.to(dev)].view(1, -1, *extra)
    if len(om) % groups or len(im) % groups:
        raise ValueError(f"a conv with {groups} groups needs widths divisible by {groups}")
    og, ig, nog, nig = c_out // groups, c_in // groups, len(om) // groups, len(im) // groups
    blocks = []
    for b in range(groups):
        o_idx, i_idx = om[b * nog : (b + 1) * nog], im[b * nig : (b + 1) * nig]
        if bool((o_idx // og != b).any()) or bool((i_idx // ig != b).any()):
            raise ValueError(
                "a grouped convolution needs a block-structured mapping (replicas stay in their "
                "group)"
            )
        o_idx, i_idx = o_idx.to(dev), i_idx.to(dev)
        blocks.append(w[o_idx][:, i_idx - b * ig] / scale[i_idx].view(1, -1, *extra))
    return torch.cat(blocks)


# ---------------------------------------------------------------------------- module level


def widen_conv(
    conv: nn.Conv2d,
    *,
    out_map: torch.Tensor | None = None,
    in_map: torch.Tensor | None = None,
) -> nn.Conv2d:
    """A new Conv2d at the widened size with every hyperparameter of ``conv``."""
    depthwise = conv.groups > 1 and conv.groups == conv.in_channels == conv.out_channels
    c_out = len(out_map) if out_map is not None else conv.out_channels
    c_in = len(in_map) if in_map is not None else conv.in_channels
    new = nn.Conv2d(
        c_in,
        c_out,
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=c_out if depthwise else conv.groups,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
        device=conv.weight.device,
        dtype=conv.weight.dtype,
    )
    with torch.no_grad():
        new.weight.copy_(
            widen_conv_weight(conv.weight, groups=conv.groups, out_map=out_map, in_map=in_map)
        )
        if conv.bias is not None:
            new.bias.copy_(take(conv.bias, out_map))
    new.train(conv.training)
    return new


def widen_bn(bn: nn.BatchNorm2d, mapping: torch.Tensor) -> nn.BatchNorm2d:
    """BatchNorm at the new width: statistics and affine parameters replicated."""
    new = nn.BatchNorm2d(
        len(mapping),
        eps=bn.eps,
        momentum=bn.momentum,
        affine=bn.affine,
        track_running_stats=bn.track_running_stats,
        device=bn.running_mean.device if bn.running_mean is not None else None,
    )
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            src = getattr(bn, name)
            if src is not None:
                getattr(new, name).copy_(take(src, mapping))
        if bn.num_batches_tracked is not None:
            new.num_batches_tracked.copy_(bn.num_batches_tracked)
    new.train(bn.training)
    return new


# ---------------------------------------------------------------------------- supernet: plumbing


@dataclass
class Morph:
    """A grown network and how its tensors relate to the old one's.

    ``names`` maps a new state-dict name to the old name it came from (absent:
    a new tensor at its initial value; several new names may come from one old
    name: a deepened cell's alphas are a copy of the normal alphas);
    ``transforms`` maps an old name to the transform that produced the new
    tensor (absent: copied unchanged).
    """

    net: SearchNetwork
    kind: str
    where: str
    names: dict[str, str] = field(default_factory=dict)
    transforms: dict[str, Transform] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> ArchSpec:
        return self.net.spec

    def carry(self, genotype: Genotype) -> Genotype:
        """``genotype`` of the old network, expressed on the grown one.

        Own cells are named by index, so after ``deepen`` those at or after the
        insertion point are renumbered like the cells, and the inserted cell is
        added as a copy of the genotype's normal cell, just as its alphas are a
        copy of the normal alphas: the genotype runs the same function on the
        grown network and names every cell with its own alphas.
        """
        if self.kind != "deepen":
            return genotype
        pos = self.details["position"]
        own = [(i + 1 if i >= pos else i, nodes, concat) for i, nodes, concat in genotype.own_cells]
        own.append((pos, genotype.normal, genotype.normal_concat))
        return replace(genotype, own_cells=tuple(own))


def _same_name(name: str) -> str:
    return name


def _build(
    old: SearchNetwork,
    spec: ArchSpec,
    rename: Callable[[str], str],
    transforms: dict[str, Transform],
) -> tuple[SearchNetwork, dict[str, str]]:
    """Build ``SearchNetwork(spec)`` and fill it from ``old`` (``rename``: old name -> new name)."""
    param = next(old.parameters())
    new = build_on(spec, param.device)  # where the old one lives, never left on the CPU
    if next(new.parameters()).dtype != param.dtype:  # a network converted to another precision
        new = new.to(dtype=param.dtype)
    new.train(old.training)
    target = new.state_dict()
    names: dict[str, str] = {}
    with torch.no_grad():
        for old_name, tensor in old.state_dict().items():
            new_name = rename(old_name)
            if new_name not in target:
                raise KeyError(f"growth lost tensor {old_name!r} (would be {new_name!r})")
            fn = transforms.get(old_name)
            value = fn(tensor, 1) if fn is not None else tensor
            if value.shape != target[new_name].shape:
                raise RuntimeError(
                    f"growth produced {tuple(value.shape)} for {new_name!r}, network expects "
                    f"{tuple(target[new_name].shape)}"
                )
            target[new_name].copy_(value)
            names[new_name] = old_name
    return new, names


def _conv_rule(rules: dict[str, Transform], prefix: str, conv: nn.Conv2d, in_map, out_map) -> None:
    groups = conv.groups

    def fn(t: torch.Tensor, power: int) -> torch.Tensor:
        return widen_conv_weight(t, groups=groups, out_map=out_map, in_map=in_map, power=power)

    rules[prefix + "weight"] = fn
    if conv.bias is not None:
        rules[prefix + "bias"] = lambda t, power: take(t, out_map)


def _bn_rule(rules: dict[str, Transform], prefix: str, bn: nn.BatchNorm2d, mapping) -> None:
    for name in ("weight", "bias", "running_mean", "running_var"):
        if getattr(bn, name) is not None:
            rules[prefix + name] = lambda t, power: take(t, mapping)


def _half(
    mapping: torch.Tensor | None, old: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if mapping is None:
        return None, None
    n = len(mapping) // 2
    a, b = mapping[:n], mapping[n:] - old // 2
    if len(mapping) % 2 or bool((a >= old // 2).any()) or bool((b < 0).any()):
        raise ValueError(
            "a FactorizedReduce output needs an even, half-structured mapping "
            "(wider_mapping(blocks=2))"
        )
    return a, b


def _op_rules(rules: dict[str, Transform], prefix: str, module: nn.Module, in_map, out_map) -> None:
    """Transforms for one op module whose input is widened by ``in_map`` and output by ``out_map``.

    Every op of the search space has a rule; an unknown module type is an error
    rather than a silently unwidened layer.
    """
    t = type(module)
    if t is nn.Conv2d:
        _conv_rule(rules, prefix, module, in_map, out_map)
    elif t is nn.BatchNorm2d:
        _bn_rule(rules, prefix, module, out_map)
    elif t is ReLUConvBN:
        _conv_rule(rules, prefix + "1.", module[1], in_map, out_map)
        _bn_rule(rules, prefix + "2.", module[2], out_map)
    elif t is DilConv:  # depthwise keeps the input width, pointwise maps in -> out
        _conv_rule(rules, prefix + "1.", module[1], in_map, in_map)
        _conv_rule(rules, prefix + "2.", module[2], in_map, out_map)
        _bn_rule(rules, prefix + "3.", module[3], out_map)
    elif t is SepConv:
        _op_rules(rules, prefix + "0.", module[0], in_map, in_map)
        _op_rules(rules, prefix + "1.", module[1], in_map, out_map)
    elif t is FactorizedReduce:
        a, b = _half(out_map, module.bn.num_features)
        _conv_rule(rules, prefix + "conv_1.", module.conv_1, in_map, a)
        _conv_rule(rules, prefix + "conv_2.", module.conv_2, in_map, b)
        _bn_rule(rules, prefix + "bn.", module.bn, out_map)
    elif t is Pool:
        _bn_rule(rules, prefix + "bn.", module.bn, out_map)
    elif t in (Zero, Identity):
        if in_map is not None and out_map is not None and not torch.equal(in_map, out_map):
            raise ValueError(f"{t.__name__} needs the same mapping on its input and output")
    else:
        raise TypeError(f"no widening rule for {t.__name__} at {prefix!r}")


def signals(spec: ArchSpec) -> tuple[list[tuple[int, int]], int]:
    """Where each cell's two inputs come from: -1 = the stem, i = the output of
    non-residual cell i (updated in place by the residual cells after it); and
    which signal the classifier reads."""
    s0 = s1 = -1
    sources = []
    for i, cs in enumerate(spec.cells):
        sources.append((s0, s1))
        if not cs.residual:
            s0, s1 = s1, i
    return sources, s1


def needs_even(spec: ArchSpec, index: int) -> bool:
    """Whether cell ``index`` holds a FactorizedReduce producing its channels."""
    return spec.cells[index].reduction or spec.inputs()[index].reduction_prev


# ---------------------------------------------------------------------------- supernet: widen


def widen_cell(
    net: SearchNetwork, index: int, new_channels: int, generator: torch.Generator | None = None
) -> Morph:
    """Widen non-residual cell ``index`` (and the residual cells that add into
    its output, which must match its width) to ``new_channels`` per node."""
    spec = net.spec
    cs = spec.cells[index]
    if cs.residual:
        raise ValueError(f"cell {index} is residual; widen the cell whose output it adds to")
    old_c = cs.channels
    if new_channels <= old_c:
        raise ValueError(
            f"widening cell {index} needs more than {old_c} channels, got {new_channels}"
        )
    sources, final = signals(spec)
    producers = [index] + [
        r for r, c in enumerate(spec.cells) if c.residual and sources[r][1] == index
    ]
    blocks = 2 if old_c % 2 == 0 and new_channels % 2 == 0 else 1
    if blocks == 1 and any(needs_even(spec, p) for p in producers):
        raise ValueError(
            f"cell {index} has a FactorizedReduce: widen it from and to even channel counts"
        )
    m = wider_mapping(old_c, new_channels, blocks=blocks, generator=generator)
    out_map = torch.cat(
        [n * old_c + m for n in range(spec.steps)]
    )  # the cell's concatenated output

    rules: dict[str, Transform] = {}
    for c, cell in enumerate(net.cells):
        assert isinstance(cell, SearchCell)
        _cell_rules(rules, c, cell, sources[c], index, out_map, m if c in producers else None)
    if final == index:
        rules["classifier.weight"] = lambda t, power: widen_conv_weight(
            t, in_map=out_map, power=power
        )

    cells = [
        replace_channels(c, new_channels) if i in producers else c for i, c in enumerate(spec.cells)
    ]
    new, names = _build(net, spec.with_cells(cells), _same_name, rules)
    return Morph(
        new,
        "widen",
        f"cell {index}",
        names,
        rules,
        {"cells": producers, "channels": [old_c, new_channels]},
    )


def _cell_rules(
    rules: dict[str, Transform],
    c: int,
    cell: SearchCell,
    sources: tuple[int, int],
    index: int,
    out_map: torch.Tensor,
    m: torch.Tensor | None,
) -> None:
    """The rules for cell ``c``: its preprocessing reads the widened output of cell
    ``index`` (``out_map``) if that is one of its sources; a producer (``m`` given)
    widens its preprocessing outputs, every op of its edges and its branches."""
    for slot in (0, 1):
        in_map = out_map if sources[slot] == index else None
        if in_map is not None or m is not None:
            _op_rules(
                rules, f"cells.{c}.preprocess{slot}.", getattr(cell, f"preprocess{slot}"), in_map, m
            )
    if m is None:
        return
    for e, mixed in enumerate(cell.edges):
        for o, op in enumerate(mixed.ops):
            _op_rules(rules, f"cells.{c}.edges.{e}.ops.{o}.", op, m, m)
    for b, op in enumerate(cell.branches):
        _op_rules(rules, f"cells.{c}.branches.{b}.", op, m, m)


def replace_channels(cs: CellSpec, channels: int) -> CellSpec:
    return replace(cs, channels=channels)


# ---------------------------------------------------------------------------- supernet: deepen


def deepen_positions(spec: ArchSpec) -> list[int]:
    """Where an identity (residual) cell can be inserted: its output width must
    equal its input's (steps * C), and C must be even after a reduction."""
    return [
        pos
        for pos, into in enumerate(spec.inputs())
        if into.c_prev % spec.steps == 0
        and not (into.reduction_prev and (into.c_prev // spec.steps) % 2)
    ]


# State-dict names that carry a cell index: cell modules, residual gates, own alphas.
_INDEXED = re.compile(r"^(cells\.|gates\.|alphas\.cell)(\d+)(.*)$")


def deepen(net: SearchNetwork, position: int) -> Morph:
    """Insert a residual normal cell with its own alphas before cell
    ``position`` (``len(cells)``: at the end).

    The cell computes ``s1 + gate * cell(s0, s1)`` with ``gate = 0``, so it is
    the identity until training opens the gate. It has fresh weights and its
    own alpha matrix ``alphas["cellN"]`` (``N = position``), initialised as a
    copy of the normal-cell alphas: what alpha-training learned carries over,
    the cell's derived ops start as the normal cell's, and from then on its
    alphas are sampled, trained and derived on their own (``own_cells`` in the
    genotype). Cells after the insertion point move up one index, and their
    weights, gates and own alphas move with them, so nothing learned is lost.
    The copy also takes over the normal alphas' optimizer state (``names``
    maps it to ``alphas.normal``; see :meth:`Morph.carry` for genotypes).
    """
    spec = net.spec
    if position not in deepen_positions(spec):
        raise ValueError(
            f"no identity cell fits at position {position}; allowed: {deepen_positions(spec)}"
        )
    c_p = spec.inputs()[position].c_prev
    cells = list(spec.cells)
    cells.insert(position, CellSpec(channels=c_p // spec.steps, residual=True, own_alphas=True))

    def rename(name: str) -> str:
        m = _INDEXED.match(name)
        if not m:
            return name
        i = int(m.group(2))
        return f"{m.group(1)}{i + 1 if i >= position else i}{m.group(3)}"

    new, names = _build(net, spec.with_cells(cells), rename, {})
    key = own_cell_name(position)
    with torch.no_grad():
        new.alphas[key].copy_(net.alphas["normal"])
    # Adam state goes with the copy, as it goes with a replicated channel in widen:
    # the copy continues the shared matrix's optimisation, with its momentum and
    # its step scale (second moments, step count). Empty state would instead make
    # Adam's first steps full-size (lr * sign of the gradient) whatever the
    # gradient's scale -- weight decay alone, while the gate is still 0 and the
    # loss gives these alphas no gradient -- and pull the copy away from what
    # alpha-training learned.
    names[f"alphas.{key}"] = "alphas.normal"
    return Morph(
        new,
        "deepen",
        f"position {position}",
        names,
        {},
        {"position": position, "channels": c_p // spec.steps},
    )


# ---------------------------------------------------------------------------- supernet: branch


def add_branch(net: SearchNetwork, index: int, node: int, input_: int, op: str) -> Morph:
    """Give node ``node`` of cell ``index`` an extra path ``gate * op(state input_)``.

    The op is a new module (its own weights, the supernet's edge ops stay as
    they were) and its gate starts at zero, so the node's value is unchanged;
    the branch runs under every plan (sampled, genotype, continuous).
    """
    spec = net.spec
    if op == NONE or op not in spec.primitives:
        raise ValueError(
            f"branch op must be one of the space's primitives other than none, got {op!r}"
        )
    cs = spec.cells[index]
    if not 0 <= node < spec.steps or not 0 <= input_ < node + 2:
        raise ValueError(f"cell {index} has no edge (node {node}, input {input_})")
    grown = replace(cs, branches=cs.branches + ((node, input_, op),))
    cells = [grown if i == index else c for i, c in enumerate(spec.cells)]
    new, names = _build(net, spec.with_cells(cells), _same_name, {})
    return Morph(
        new,
        "branch",
        f"cell {index} node {node} input {input_} {op}",
        names,
        {},
        {"cell": index, "node": node, "input": input_, "op": op},
    )


# ---------------------------------------------------------------------------- optimizers


def remap_optimizer(
    old_opt: torch.optim.Optimizer,
    old_net: nn.Module,
    new_params: Sequence[nn.Parameter],
    morph: Morph,
) -> torch.optim.Optimizer:
    """A new optimizer of the same type and settings over ``new_params``,
    carrying the state of every surviving parameter (transformed like the
    parameter itself; new parameters start with empty state).

    Momentum is transformed exactly like its weight, so the next step's
    momentum term moves the grown network's function as it would have moved
    the old one's (replicated rows move alike; divided columns sum back).
    """
    new_opt = type(old_opt)(list(new_params), **old_opt.defaults)
    for group_new, group_old in zip(new_opt.param_groups, old_opt.param_groups):
        for key, value in group_old.items():
            if key != "params":
                group_new[key] = value
    old_by_name = {n: p for n, p in old_net.named_parameters()}
    new_names = {id(p): n for n, p in morph.net.named_parameters()}
    for p in new_params:
        old_name = morph.names.get(new_names[id(p)])
        if old_name is None or old_by_name[old_name] not in old_opt.state:
            continue
        old_p = old_by_name[old_name]
        fn = morph.transforms.get(old_name)
        state = {}
        for key, value in old_opt.state[old_p].items():
            if torch.is_tensor(value) and value.shape == old_p.shape and value.dim() > 0:
                value = (
                    fn(value, 2 if key in SECOND_MOMENTS else 1)
                    if fn is not None
                    else value.clone()
                )
            elif torch.is_tensor(value):
                value = value.clone()
            state[key] = value
        new_opt.state[p] = state
    return new_opt
