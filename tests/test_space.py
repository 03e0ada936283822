"""Search space: operations, genotypes, derivation and hard path sampling."""

from __future__ import annotations

import shutil

import pytest
import torch

from asolab.config import SpaceConfig
from asolab.space import OPS, PRIMITIVES, ArchSpec, Genotype, SearchNetwork, diff, distance
from asolab.space.cells import edge_index


@pytest.mark.parametrize("name", PRIMITIVES)
@pytest.mark.parametrize("stride", [1, 2])
def test_every_primitive_keeps_shapes(name, stride):
    op = OPS[name](6, stride, False)
    x = torch.randn(2, 6, 8, 8)
    assert op(x).shape == (2, 6, 8 // stride, 8 // stride)
    if name != "none" and not (name == "skip_connect" and stride == 1):
        # odd sizes too (7 -> 4 with stride 2)
        assert op(torch.randn(2, 6, 7, 7)).shape[-1] == (7 if stride == 1 else 4)


G = Genotype.parse(
    "normal: sep_conv_3x3(0) skip_connect(1) | dil_conv_3x3(0) sep_conv_3x3(2) -> 2,3 ; "
    "reduce: max_pool_3x3(0) max_pool_3x3(1) | skip_connect(2) max_pool_3x3(0) -> 2,3"
)


def test_genotype_string_and_json_round_trip():
    assert Genotype.parse(str(G)) == G
    assert Genotype.from_json(G.to_json()) == G
    assert hash(Genotype.from_json(G.to_json())) == hash(G)
    assert G.num_edges == 8


def test_edge_order_does_not_matter_and_darts_lists_parse():
    flat = {
        "normal": [
            ["skip_connect", 1],
            ["sep_conv_3x3", 0],
            ["sep_conv_3x3", 2],
            ["dil_conv_3x3", 0],
        ],
        "normal_concat": [2, 3],
        "reduce": [
            ["max_pool_3x3", 1],
            ["max_pool_3x3", 0],
            ["max_pool_3x3", 0],
            ["skip_connect", 2],
        ],
        "reduce_concat": [2, 3],
    }
    assert Genotype.from_dict(flat) == G


def test_genotype_refuses_bad_input_index_and_bad_strings():
    with pytest.raises(ValueError, match="reads input 3"):
        Genotype(
            normal=((("skip_connect", 3), ("skip_connect", 0)),),
            normal_concat=(2,),
            reduce=((("skip_connect", 0),),),
            reduce_concat=(2,),
        )
    with pytest.raises(ValueError, match="not a genotype string"):
        Genotype.parse("hello")


def test_diff_and_distance():
    h = G.replace_op("normal", 1, 2, "avg_pool_3x3")
    changes = diff(G, h)
    assert [(c.cell, c.node, c.input, c.before, c.after) for c in changes] == [
        ("normal", 1, 2, ("sep_conv_3x3",), ("avg_pool_3x3",))
    ]
    assert distance(G, G) == 0 and distance(G, h) == distance(h, G) == 1
    k = h.replace_op("reduce", 0, 0, "sep_conv_5x5")
    assert distance(G, k) <= distance(G, h) + distance(h, k)


def _net(primitives=PRIMITIVES, steps=2) -> SearchNetwork:
    torch.manual_seed(0)
    spec = ArchSpec.from_config(
        SpaceConfig(init_channels=4, layers=3, steps=steps, primitives=tuple(primitives)), 1, 10
    )
    return SearchNetwork(spec)


def _net_with_alphas(entries) -> SearchNetwork:
    """A network whose normal and reduce alphas are zero but for ``(row, op, value)``."""
    net = _net()
    with torch.no_grad():
        for kind in ("normal", "reduce"):
            net.alphas[kind].zero_()
            for row, op, value in entries:
                net.alphas[kind][row, PRIMITIVES.index(op)] = value
    return net


def test_derive_keeps_top_two_inputs_by_strongest_non_none_op():
    net = _net_with_alphas(
        [
            (slice(None), "none", 10.0),  # 'none' is never chosen, however strong
            (edge_index(0, 0), "sep_conv_3x3", 3.0),
            (edge_index(0, 1), "skip_connect", 2.0),
            (edge_index(1, 0), "max_pool_3x3", 1.0),
            (edge_index(1, 1), "dil_conv_5x5", 4.0),
            (edge_index(1, 2), "avg_pool_3x3", 5.0),
        ]
    )
    g = net.derive()
    expected = (
        (("sep_conv_3x3", 0), ("skip_connect", 1)),
        (("dil_conv_5x5", 1), ("avg_pool_3x3", 2)),
    )
    assert g.normal == Genotype(expected, (2, 3), expected, (2, 3)).normal
    assert g.reduce == g.normal and g.normal_concat == (2, 3)


def test_param_free_cap_swaps_the_cheapest_parameter_free_ops_for_weighted_ones():
    """derive(cap): a cell keeps at most ``cap`` pools/skips; the edge that loses the
    least softmax weight by the swap takes its strongest op with weights first."""
    net = _net_with_alphas(
        [
            (edge_index(0, 0), "sep_conv_3x3", 3.0),
            (edge_index(0, 1), "skip_connect", 2.0),
            (edge_index(0, 1), "dil_conv_3x3", 1.9),  # the cheap swap
            (edge_index(1, 1), "dil_conv_5x5", 4.0),
            (edge_index(1, 2), "avg_pool_3x3", 5.0),
            (edge_index(1, 2), "sep_conv_5x5", 1.0),  # the dear one
        ]
    )
    uncapped = net.derive()
    assert uncapped == net.derive(2) and uncapped.most_param_free() == 2
    assert uncapped.normal[0] == (("sep_conv_3x3", 0), ("skip_connect", 1))
    one = net.derive(1)
    assert one.normal == (
        (("sep_conv_3x3", 0), ("dil_conv_3x3", 1)),
        (("dil_conv_5x5", 1), ("avg_pool_3x3", 2)),
    )
    assert one.reduce == one.normal and one.most_param_free() == 1
    none_left = net.derive(0)
    assert none_left.normal[1] == (("dil_conv_5x5", 1), ("sep_conv_5x5", 2))
    assert none_left.most_param_free() == 0


def _count_calls(net: SearchNetwork) -> dict[int, int]:
    counts: dict[int, int] = {}
    for cell in net.cells:
        for mixed in cell.edges:
            for op in mixed.ops:
                counts[id(op)] = 0
                op.register_forward_hook(
                    lambda m, i, o, key=id(op): counts.__setitem__(key, counts[key] + 1)
                )
    return counts


@pytest.mark.parametrize("differentiable", [False, True])
def test_hard_sampling_runs_exactly_one_op_per_edge(differentiable):
    net = _net()
    counts = _count_calls(net)
    net(torch.randn(2, 1, 8, 8), net.sample_plans(1.0, differentiable=differentiable))
    edges = sum(len(cell.edges) for cell in net.cells)
    assert sum(counts.values()) == edges
    for cell in net.cells:
        for mixed in cell.edges:
            assert sum(counts[id(op)] for op in mixed.ops) == 1


def test_genotype_plan_runs_only_the_genotype_edges():
    net = _net()
    counts = _count_calls(net)
    net(torch.randn(2, 1, 8, 8), net.genotype_plans(G))
    assert sum(counts.values()) == len(net.cells) * 4  # 2 nodes x 2 edges per cell


def test_weights_and_alphas_partition_parameters_by_identity():
    net = _net()
    weights, alphas = net.weight_parameters(), net.alpha_parameters()
    ids_w, ids_a = {id(p) for p in weights}, {id(p) for p in alphas}
    assert not ids_w & ids_a
    assert len(ids_w) == len(weights) and len(ids_a) == 2
    assert ids_w | ids_a == {id(p) for p in net.parameters()}


def test_derived_parameter_count_is_below_supernet():
    net = _net()
    assert 0 < net.count_derived(G) < net.num_weights()


def test_exported_saves_what_extract_copies_and_leaves_the_supernet_as_it_was(tmp_path):
    """The tracker saves the final network through ``exported`` (no copy): the saved
    model holds the derived network's weights only, computes what ``extract``'s copy
    computes, and the supernet gets every op and its mode back, also after an error."""
    from asolab.space.network import exported, extract

    net = _net()
    net.train()
    ops_before = [op for cell in net.cells for edge in cell.edges for op in edge.ops]
    x = torch.randn(3, 1, 8, 8)
    copy = extract(net, G)
    with exported(net, G) as view:
        torch.save(view, tmp_path / "m.pt")
        assert sum(p.numel() for p in view.parameters()) == sum(
            p.numel() for p in copy.parameters()
        )
    with pytest.raises(RuntimeError), exported(net, G):
        raise RuntimeError("save failed")
    assert [op for cell in net.cells for edge in cell.edges for op in edge.ops] == ops_before
    assert net.training
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    with torch.no_grad():
        assert torch.equal(loaded(x), copy(x))
    assert sum(p.numel() for p in loaded.parameters()) < net.num_weights()


def test_a_network_built_for_one_genotype_holds_its_ops_alone_and_loads_its_weights():
    """``SearchNetwork(spec, only=g)`` (what ``standalone`` and the FLOPs count build):
    every op ``g`` does not run is an empty placeholder, as ``exported`` leaves them, so
    the derived network's weights load into it and compute what they computed; a grown
    network (a residual cell with its own alphas, a gated branch) included."""
    from test_step_cost import _grown_net

    from asolab.space.network import derived_state, exported, standalone

    net = _grown_net().eval()
    g = net.derive()
    sparse = SearchNetwork(net.spec, only=g)
    with exported(net, g) as view:
        kinds = [type(m).__name__ for m in view.supernet.modules()]
    assert [type(m).__name__ for m in sparse.modules()] == kinds
    assert sparse.count_derived(g) == net.count_derived(g)
    assert sum(p.numel() for p in sparse.parameters()) < net.num_weights() / 2
    alone = standalone(net.spec, g)
    alone.load_state_dict(derived_state(net, g), strict=True)
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(alone(x), net(x, net.genotype_plans(g)))
    foreign = Genotype.parse(str(g) + " ; cell9: skip_connect(0) skip_connect(1) -> 2")
    with pytest.raises(ValueError, match="describes cell9"):  # an own cell it does not have
        SearchNetwork(net.spec, only=foreign)


# --------------------------------------------------------------------- own-alpha cells in genotypes

OWN = Genotype.parse(
    str(G) + " ; cell4: skip_connect(0) sep_conv_3x3(1) | sep_conv_5x5(1) skip_connect(2) -> 2,3"
    " ; cell2: avg_pool_3x3(0) avg_pool_3x3(1) | avg_pool_3x3(0) avg_pool_3x3(2) -> 2,3"
)


def test_genotype_without_own_cells_prints_and_serialises_exactly_as_before():
    assert str(G) == (
        "normal: sep_conv_3x3(0) skip_connect(1) | dil_conv_3x3(0) sep_conv_3x3(2) -> 2,3 ; "
        "reduce: max_pool_3x3(0) max_pool_3x3(1) | max_pool_3x3(0) skip_connect(2) -> 2,3"
    )
    assert G.to_json() == (
        '{"normal": [[["sep_conv_3x3", 0], ["skip_connect", 1]], '
        '[["dil_conv_3x3", 0], ["sep_conv_3x3", 2]]], '
        '"normal_concat": [2, 3], '
        '"reduce": [[["max_pool_3x3", 0], ["max_pool_3x3", 1]], '
        '[["max_pool_3x3", 0], ["skip_connect", 2]]], '
        '"reduce_concat": [2, 3]}'
    )
    assert G.own_cells == () and G.cell_names == ("normal", "reduce")


def test_own_cells_print_in_index_order_and_round_trip():
    assert OWN.cell_names == ("normal", "reduce", "cell2", "cell4")
    assert str(OWN) == (
        str(G)
        + " ; cell2: avg_pool_3x3(0) avg_pool_3x3(1) | avg_pool_3x3(0) avg_pool_3x3(2) -> 2,3"
        " ; cell4: skip_connect(0) sep_conv_3x3(1) | sep_conv_5x5(1) skip_connect(2) -> 2,3"
    )
    assert Genotype.parse(str(OWN)) == OWN and Genotype.from_json(OWN.to_json()) == OWN
    assert hash(Genotype.from_json(OWN.to_json())) == hash(OWN)
    assert OWN.to_dict()["own_cells"][0] == {
        "cell": 2,
        "nodes": [
            [["avg_pool_3x3", 0], ["avg_pool_3x3", 1]],
            [["avg_pool_3x3", 0], ["avg_pool_3x3", 2]],
        ],
        "concat": [2, 3],
    }
    assert OWN.num_edges == 16 and {c for c, _, _, _ in OWN.edges()} == {
        "normal",
        "reduce",
        "cell2",
        "cell4",
    }
    assert (
        OWN != G
        and Genotype(G.normal, G.normal_concat, G.reduce, G.reduce_concat, OWN.own_cells) == OWN
    )


def test_own_cells_are_validated_and_bad_strings_refused():
    with pytest.raises(ValueError, match="cell4 node 0 reads input 2"):
        Genotype(G.normal, (2, 3), G.reduce, (2, 3), ((4, ((("skip_connect", 2),),), (2,)),))
    with pytest.raises(ValueError, match="distinct"):
        Genotype(G.normal, (2, 3), G.reduce, (2, 3), ((4, G.normal, (2, 3)), (4, G.reduce, (2, 3))))
    with pytest.raises(ValueError, match="two 'cell4' parts"):
        Genotype.parse(str(OWN) + " ; cell4: skip_connect(0) | skip_connect(0) -> 2,3")
    with pytest.raises(ValueError, match="not a genotype string"):
        Genotype.parse(str(G) + " ; deep: skip_connect(0) -> 2")
    with pytest.raises(KeyError, match="no cell 'cell3'"):
        OWN.cell("cell3")


def test_diff_and_distance_see_own_cells():
    h = OWN.replace_op("cell4", 1, 1, "max_pool_3x3")
    assert (
        h.cell("cell4")[1] == (("max_pool_3x3", 1), ("skip_connect", 2)) and h.normal == OWN.normal
    )
    assert [(c.cell, c.node, c.input, c.before, c.after) for c in diff(OWN, h)] == [
        ("cell4", 1, 1, ("sep_conv_5x5",), ("max_pool_3x3",))
    ]
    assert distance(OWN, h) == distance(h, OWN) == 1
    # A cell only one genotype has: each of its edges plus its concat list.
    assert distance(G, OWN) == 8 + 2 and [c.cell for c in diff(G, OWN)][:1] == ["cell2"]
    assert distance(G, h) <= distance(G, OWN) + distance(OWN, h)


def test_cell_picture_draws_own_cells_too():
    import io

    from PIL import Image

    from asolab.space.plot import cell_layout, genotype_png

    def titled(genotype: Genotype) -> list[str]:
        return [p.title.removesuffix(" cell") for p in cell_layout(genotype)]

    assert titled(OWN) == ["normal", "reduce", "cell2", "cell4"]
    assert titled(G) == ["normal", "reduce"]
    # Every edge of the genotype is drawn with its op, plus one dashed arrow per concat entry.
    for panel, kind in zip(cell_layout(OWN), OWN.cell_names):
        ops = sorted(e.label for e in panel.edges if not e.dashed)
        assert ops == sorted(op for node in OWN.cell(kind) for op, _ in node)
        assert sum(e.dashed for e in panel.edges) == len(OWN.concat(kind))
    png = genotype_png(OWN, title="cycle 3")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    # Four panels make a bigger picture than two (graphviz stacks them; Pillow puts them side
    # by side).
    big, small = Image.open(io.BytesIO(png)), Image.open(io.BytesIO(genotype_png(G)))
    assert big.width * big.height > small.width * small.height
    from asolab.space.plot import _pillow_png

    wide, narrow = (
        Image.open(io.BytesIO(_pillow_png(OWN, "cycle 3"))),
        Image.open(io.BytesIO(_pillow_png(G))),
    )
    assert wide.width > narrow.width


@pytest.mark.skipif(
    shutil.which("dot") is None, reason="graphviz's dot is not installed (apt install graphviz)"
)
def test_cell_picture_labels_are_inside_and_never_overlap():
    """Graphviz lays the cells out: every edge label's box lies inside the picture and
    overlaps no other label and no state's box (read from ``dot -Tjson``)."""
    import json

    from asolab.space.plot import genotype_dot, genotype_png, run_dot

    for g in (G, OWN):
        layout = json.loads(run_dot(genotype_dot(g, "final genotype"), "json"))
        x0, y0, x1, y1 = map(float, layout["bb"].split(","))
        labels, nodes = [], []
        for e in layout["edges"]:
            for op in e.get("_ldraw_", []):
                if op["op"] == "T":  # text at pt, centred, width in points; height ~ font size
                    (x, y), w, h = op["pt"], op["width"], 12.0
                    labels.append((op["text"], (x - w / 2, y - 3, x + w / 2, y + h - 3)))
        for n in layout["objects"]:
            if "pos" in n and "width" in n:
                x, y = map(float, n["pos"].split(","))
                w, h = float(n["width"]) * 72 / 2, float(n["height"]) * 72 / 2
                nodes.append((x - w, y - h, x + w, y + h))
        ops = [op for kind in g.cell_names for node in g.cell(kind) for op, _ in node]
        assert sorted(t for t, _ in labels) == sorted(ops)
        boxes = [b for _, b in labels]

        def overlap(a, b):
            return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

        for i, a in enumerate(boxes):
            assert x0 <= a[0] and a[2] <= x1 and y0 <= a[1] and a[3] <= y1, (
                labels[i],
                layout["bb"],
            )
            assert not any(overlap(a, b) for b in boxes[i + 1 :]), labels[i]
            assert not any(overlap(a, n) for n in nodes), labels[i]
        # state names are c_{k-2}, c_{k-1} (subscripts), 0.., c_k: never the literal LaTeX
        assert "c_{k" not in genotype_dot(g)
        assert genotype_png(g).startswith(b"\x89PNG")


def test_stem_stride_two_halves_the_resolution_every_cell_runs_at():
    """``space.stem_stride = 2``: the stem convolution downsamples, so each cell sees
    half the side it sees with stride 1, and the network still classifies (supernet
    and derived genotype alike) with the same weights shapes."""
    sides: dict[int, list[int]] = {}
    for stride in (1, 2):
        torch.manual_seed(0)
        spec = ArchSpec.from_config(SpaceConfig(init_channels=4, stem_stride=stride), 1, 10)
        net = SearchNetwork(spec)
        seen: list[int] = []
        for cell in net.cells:
            cell.register_forward_hook(lambda m, args, out, seen=seen: seen.append(out.shape[-1]))
        x = torch.randn(2, 1, 28, 28)
        assert net(x, net.sample_plans(1.0, False)).shape == (2, 10)
        assert net(x, net.genotype_plans(G)).shape == (2, 10)
        sides[stride] = seen
        assert spec.stem_stride == stride
    assert sides[1][:3] == [28, 14, 7]
    assert sides[2][:3] == [14, 7, 4]


def test_stem_stride_round_trips_and_older_specs_read_as_stride_one():
    spec = ArchSpec.from_config(SpaceConfig(init_channels=4, stem_stride=2), 1, 10)
    assert ArchSpec.from_dict(spec.to_dict()) == spec
    older = {k: v for k, v in spec.to_dict().items() if k != "stem_stride"}
    assert ArchSpec.from_dict(older).stem_stride == 1


def test_a_genotype_is_built_from_its_cells_by_name():
    """Genotype.from_cells: nodes per cell name (own cells as cellN), one concat or one per cell."""
    from asolab.space.genotype import Genotype

    nodes = ((("skip_connect", 0), ("sep_conv_3x3", 1)),)
    g = Genotype.from_cells({"normal": nodes, "reduce": nodes, "cell2": nodes}, range(2, 3))
    assert g == Genotype.parse(str(g)) and g.own_cells == ((2, nodes, (2,)),)
    per_cell = Genotype.from_cells(
        {"normal": nodes, "reduce": nodes}, {"normal": [2], "reduce": [2]}
    )
    assert per_cell.normal_concat == per_cell.reduce_concat == (2,)
    with pytest.raises(ValueError, match="reduce"):
        Genotype.from_cells({"normal": nodes}, [2])
