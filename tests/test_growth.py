"""Function-preserving growth: widen, deepen, branch on plain nets, the supernet and the runner."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import cell_layouts

from asolab import config
from asolab.config import GrowthConfig
from asolab.evolution import growth, morphism
from asolab.evolution.mutation import mutate
from asolab.runner import checkpoint as ckpt
from asolab.runner.cycle import Runner
from asolab.runner.events import Recorder
from asolab.space.genotype import Genotype, diff, distance
from asolab.space.network import SearchNetwork
from asolab.space.ops import PRIMITIVES
from asolab.space.spec import ArchSpec

TOL = 1e-4
PRIMITIVE_SETS = [
    ("sep_conv_3x3", "skip_connect"),
    ("none", "max_pool_3x3", "dil_conv_5x5"),
    PRIMITIVES,
]


# ----------------------------------------------------------------------- plain conv-BN-ReLU fixture


def _plain(widths: tuple[int, int, int]) -> nn.Sequential:
    a, b, c = widths
    return nn.Sequential(
        nn.Conv2d(3, a, 3, padding=1, bias=False),
        nn.BatchNorm2d(a),
        nn.ReLU(),
        nn.Conv2d(a, b, 3, stride=2, padding=2, dilation=2, groups=2, bias=True),
        nn.BatchNorm2d(b),
        nn.ReLU(),
        nn.Conv2d(b, b, 3, padding=1, groups=b, bias=False),
        nn.BatchNorm2d(b),
        nn.ReLU(),  # depthwise
        nn.Conv2d(b, c, 1, bias=True),
        nn.BatchNorm2d(c),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(c, 5),
    )


def _warm_bn(model: nn.Module, *inputs: torch.Tensor, plans=None) -> None:
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(*inputs) if plans is None else model(*inputs, plans)
    model.eval()


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_plain_network_middle_layer_widened_1_5x_keeps_every_output():
    torch.manual_seed(0)
    net = _plain((8, 12, 8))
    x = torch.randn(16, 3, 10, 10)
    _warm_bn(net, torch.randn(32, 3, 10, 10))
    before = net(x).detach()
    params_before = _count(net)
    old_var = net[4].running_var.clone()
    m = morphism.wider_mapping(12, 18, blocks=2)  # 1.5x; blocks because the producer has 2 groups
    net[3] = morphism.widen_conv(net[3], out_map=m)
    net[4] = morphism.widen_bn(net[4], m)
    net[6] = morphism.widen_conv(net[6], in_map=m, out_map=m)
    net[7] = morphism.widen_bn(net[7], m)
    net[9] = morphism.widen_conv(net[9], in_map=m)
    after = net(x).detach()
    params_after = _count(net)
    print(
        f"plain net widened 12 -> 18: params {params_before} -> {params_after}, "
        f"max|dlogits| {(after - before).abs().max():.2e}"
    )
    assert (after - before).abs().max().item() <= 1e-5
    assert params_after > params_before
    conv = net[3]
    assert (conv.stride, conv.padding, conv.dilation, conv.groups, conv.out_channels) == (
        (2, 2),
        (2, 2),
        (2, 2),
        2,
        18,
    )
    assert conv.bias is not None and net[6].groups == 18 and net[9].in_channels == 18
    assert torch.equal(net[4].running_var, old_var[m])  # statistics replicated


def test_widening_without_rescaling_the_consumer_changes_the_output():
    """Negative control: the consumer's division is what preserves the function."""
    torch.manual_seed(1)
    w = torch.randn(4, 6, 1, 1)
    m = morphism.wider_mapping(6, 9)
    x = torch.randn(2, 6, 3, 3)
    good = F.conv2d(x[:, m], morphism.widen_conv_weight(w, in_map=m))
    bad = F.conv2d(x[:, m], w[:, m])
    assert torch.allclose(good, F.conv2d(x, w), atol=1e-6)
    assert not torch.allclose(bad, F.conv2d(x, w), atol=1e-3)


def test_grouped_conv_rejects_mapping_that_crosses_groups():
    w = torch.randn(4, 2, 3, 3)  # 4 -> 4 channels, 2 groups
    crossing = torch.tensor([0, 1, 2, 3, 3, 0])
    with pytest.raises(ValueError, match="block-structured"):
        morphism.widen_conv_weight(w, groups=2, out_map=crossing)


# ---------------------------------------------------------------------------- supernet


def _supernet(primitives: tuple[str, ...]) -> SearchNetwork:
    """Cells N R R N, plus a residual cell after the first reduction and branches,
    with non-zero gates so that widening them is really exercised."""
    torch.manual_seed(0)
    space = config.SpaceConfig(primitives=primitives, init_channels=4, layers=4, steps=2)
    net = SearchNetwork(ArchSpec.from_config(space, 1, 10))
    op = next(p for p in primitives if p != "none")
    net = morphism.deepen(net, 2).net
    net = morphism.add_branch(net, 1, 0, 1, op).net  # a reduction cell, strided edge
    net = morphism.add_branch(net, 2, 1, 2, op).net  # the residual cell
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "gate" in name:
                p.fill_(0.5)
    _warm_bn(net, torch.randn(32, 1, 8, 8), plans=net.continuous_plans())
    return net


@pytest.fixture(
    scope="module", params=range(len(PRIMITIVE_SETS)), ids=["sep+skip", "none+pool+dil5", "all"]
)
def supernet(request) -> SearchNetwork:
    return _supernet(PRIMITIVE_SETS[request.param])


def _logits(net: SearchNetwork, x: torch.Tensor) -> torch.Tensor:
    net.eval()
    with torch.no_grad():
        return net(x, net.continuous_plans())  # every candidate op of every edge runs


def _growths(net: SearchNetwork) -> list[morphism.Morph]:
    spec = net.spec
    out = []
    for i, cs in enumerate(spec.cells):  # every non-residual cell, reductions included
        if not cs.residual:
            out.append(
                morphism.widen_cell(
                    net, i, growth.widened_channels(cs.channels, 0.5, cs.channels % 2 == 0)
                )
            )
    for pos in morphism.deepen_positions(spec):  # before/after each reduction, start and end
        out.append(morphism.deepen(net, pos))
    op = [p for p in spec.primitives if p != "none"][-1]
    for cell, node, inp in [(0, 0, 0), (1, 0, 0), (1, 1, 2), (3, 1, 1), (4, 0, 1)]:
        out.append(morphism.add_branch(net, cell, node, inp, op))
    return out


def test_every_growth_preserves_logits_on_random_and_digits_inputs(supernet, digits):
    # One batch of both (16 random inputs, then 64 digits): in eval mode each input's
    # logits are its own, and each network runs once per growth instead of twice.
    x = torch.cat([torch.randn(16, 1, 8, 8), digits.val.x[:64]])
    before = _logits(supernet, x)
    params = supernet.num_weights()
    kinds = set()
    for morph in _growths(supernet):
        err = (_logits(morph.net, x) - before).abs()
        err_r, err_d = err[:16].max().item(), err[16:].max().item()
        assert err_r <= TOL and err_d <= TOL, (
            f"{morph.kind} at {morph.where}: {err_r:.2e} / {err_d:.2e}"
        )
        assert morph.net.num_weights() > params, (
            f"{morph.kind} at {morph.where} did not add parameters"
        )
        kinds.add(morph.kind)
    assert kinds == {"widen", "deepen", "branch"}


def test_derived_network_counts_and_calibrates_growth_branches():
    torch.manual_seed(0)
    net = SearchNetwork(
        ArchSpec.from_config(config.SpaceConfig(init_channels=4, layers=3, steps=2), 1, 10)
    )
    g = net.derive()
    before = net.count_derived(g)
    grown = morphism.add_branch(
        net, 0, 1, 0, "sep_conv_3x3"
    ).net  # runs under every plan, genotype plans too
    branch = grown.cells[0].branches[0]
    expected = sum(p.numel() for p in branch.parameters()) + 1  # the op and its gate
    assert grown.count_derived(g) == before + expected
    deeper = morphism.deepen(grown, 1).net
    assert deeper.count_derived(g) > grown.count_derived(g)
    bn = next(m for m in grown.cells[0].branches[0].modules() if isinstance(m, nn.BatchNorm2d))
    _warm_bn(
        grown, torch.randn(8, 1, 8, 8), plans=grown.genotype_plans(g)
    )  # 3 batches of statistics
    grown.recalibrate_batchnorm(g, [torch.randn(8, 1, 8, 8)])
    assert (
        int(bn.num_batches_tracked) == 1
    )  # the branch's statistics were re-estimated with the path's


def test_widening_reaches_residual_cells_branches_and_classifier():
    net = _supernet(PRIMITIVES)
    morph = morphism.widen_cell(
        net, 1, 12
    )  # cell 1 (reduction) feeds residual cell 2 and cells 3, 4
    assert morph.details["cells"] == [1, 2]
    assert [c.channels for c in morph.spec.cells] == [4, 12, 12, 16, 16]
    wide = morphism.widen_cell(net, 4, 24)
    assert wide.net.classifier.in_features == 48
    assert wide.net.cells[4].edges[0].ops[PRIMITIVES.index("sep_conv_3x3")][0][1].groups == 24


def test_widen_rejects_residual_cells_and_odd_reductions():
    net = _supernet(PRIMITIVES)
    with pytest.raises(ValueError, match="residual"):
        morphism.widen_cell(net, 2, 16)
    with pytest.raises(ValueError, match="even"):
        morphism.widen_cell(net, 1, 11)


def _step(
    net: SearchNetwork, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, plans
) -> float:
    net.train()
    loss = F.cross_entropy(net(x, plans), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def test_training_after_growth_and_optimizer_state_carried(digits):
    net = _supernet(PRIMITIVES)
    x, y = digits.train.x[:32], digits.train.y[:32]
    sgd = torch.optim.SGD(net.weight_parameters(), lr=0.01, momentum=0.9)
    adam = torch.optim.Adam(net.alpha_parameters(), lr=3e-3, betas=(0.5, 0.999))
    _step(net, sgd, x, y, net.continuous_plans())  # every op gets a gradient, hence momentum
    _step(net, adam, x, y, net.sample_plans(1.0, differentiable=True))
    for morph in [
        morphism.widen_cell(net, 3, 24),
        morphism.deepen(net, 0),
        morphism.add_branch(net, 4, 1, 0, "sep_conv_5x5"),
    ]:
        new_sgd = morphism.remap_optimizer(sgd, net, morph.net.weight_parameters(), morph)
        new_adam = morphism.remap_optimizer(adam, net, morph.net.alpha_parameters(), morph)
        held = [id(p) for opt in (new_sgd, new_adam) for g in opt.param_groups for p in g["params"]]
        assert len(held) == len(set(held)) and set(held) == {id(p) for p in morph.net.parameters()}
        old = dict(net.named_parameters())
        checked = 0
        for name, p in morph.net.named_parameters():
            old_name = morph.names.get(name)
            if old_name is None:
                assert p not in new_sgd.state  # new parameters start with empty state
                continue
            opt_old, opt_new = (adam, new_adam) if name.startswith("alphas") else (sgd, new_sgd)
            key = "exp_avg" if name.startswith("alphas") else "momentum_buffer"
            buf_old = opt_old.state[old[old_name]].get(key)
            if buf_old is None:
                continue
            buf_new = opt_new.state[p][key]
            checked += 1
            fn = morph.transforms.get(old_name)
            expected = fn(buf_old, 1) if fn else buf_old
            assert torch.equal(buf_new, expected), name
            assert torch.equal(
                p.detach(), fn(old[old_name].detach(), 1) if fn else old[old_name].detach()
            )
        assert checked >= len(old) - 10
        loss = _step(morph.net, new_sgd, x, y, morph.net.sample_plans(1.0, differentiable=False))
        loss2 = _step(morph.net, new_adam, x, y, morph.net.sample_plans(1.0, differentiable=True))
        assert torch.isfinite(torch.tensor([loss, loss2])).all()


# ---------------------------------------------------------------------------- policy


def test_policy_kinds_and_plateau():
    assert growth.growth_kind(GrowthConfig(policy="none"), 0, []) is None
    assert [growth.growth_kind(GrowthConfig(policy="cycle"), c, []) for c in range(4)] == [
        "widen",
        "deepen",
        "branch",
        "widen",
    ]
    plateau = GrowthConfig(policy="plateau", plateau_patience=2)
    assert growth.growth_kind(plateau, 3, [0.5, 0.6, 0.7]) is None  # still improving
    assert (
        growth.growth_kind(plateau, 3, [0.5, 0.6, 0.55]) is None
    )  # not yet patience cycles of stall
    assert growth.growth_kind(plateau, 3, [0.7, 0.6, 0.65]) == "widen"
    assert (
        growth.growth_steps(0.0) == 1
        and growth.growth_steps(0.5) == 2
        and growth.growth_steps(1.0) == 3
    )
    assert (
        growth.widened_channels(16, 0.25, True) == 20 and growth.widened_channels(4, 0.1, True) == 6
    )
    assert growth.widened_channels(5, 0.0, False) == 6


# ---------------------------------------------------------------------------- runner


def test_runner_grows_preserves_and_resumes_exactly(tiny_cfg, digits, tmp_path):
    # final_genotype = "last": the finished runner then holds exactly the state of its
    # last checkpoint ("best" may pick and recalibrate an earlier cycle's genotype).
    cfg = tiny_cfg.replace(
        **{
            "growth.policy": "cycle",
            "mutation.strength": 0.5,
            "search.cycles": 3,
            "search.final_genotype": "last",
            "space.init_channels": 8,  # narrower keeps the plain layout on the CPU
            "data.train_subset": 64,  # one W-step an epoch: growth is what is checked here
        }
    )
    rec = Recorder()
    runner = Runner(cfg, [rec], checkpoint_dir=tmp_path)  # loads the subset cfg names
    start = runner.net.num_weights()
    runner.run()
    events = rec.of("growth")
    assert [e.kind for e in events] == ["widen", "widen", "deepen", "deepen", "branch", "branch"]
    for e in events:
        assert e.preservation_error <= TOL and e.params_after > e.params_before
        assert e.val_acc_after == pytest.approx(e.val_acc_before, abs=0.01)
    assert runner.net.num_weights() == events[-1].params_after > start
    assert runner.spec == runner.net.spec and len(runner.spec.cells) == 5
    # speed.channels_last (the default): the modules growth added take the run's layout too
    with torch.no_grad():
        _, layouts = cell_layouts(runner.net, lambda: runner._logits(digits.val.x[:8]))
    assert layouts == [True] * 5
    resumed = Runner.resume(tmp_path / "checkpoint.pt")
    assert resumed.spec == runner.spec
    x = digits.val.x[:64]
    assert torch.equal(resumed._logits(x), runner._logits(x))


def test_max_params_caps_growth_and_a_skipped_growth_is_a_warning(tiny_cfg, caplog):
    cfg = tiny_cfg.replace(**{"growth.policy": "widen", "search.cycles": 1, "growth.max_params": 1})
    rec = Recorder()
    runner = Runner(cfg, [rec])
    start = runner.net.num_weights()
    with caplog.at_level(logging.WARNING, logger="asolab"):
        runner.run()
    assert rec.of("growth") == [] and runner.net.num_weights() == start
    (record,) = [r for r in caplog.records if "growth" in r.getMessage()]
    assert record.levelno == logging.WARNING and "growth.max_params" in record.getMessage()


# ----------------------------------------------------------- deepen: the inserted cell's own alphas


def _searched_supernet() -> tuple[SearchNetwork, torch.optim.Optimizer]:
    """Cells N R R N with distinct, non-trivial alphas and an Adam state, as after
    alpha-training."""
    torch.manual_seed(3)
    space = config.SpaceConfig(init_channels=4, layers=4, steps=2)
    net = SearchNetwork(ArchSpec.from_config(space, 1, 10))
    with torch.no_grad():
        for a in net.alphas.values():
            a.copy_(torch.randn_like(a))
    _warm_bn(net, torch.randn(32, 1, 8, 8), plans=net.continuous_plans())
    adam = torch.optim.Adam(net.alpha_parameters(), lr=3e-3, betas=(0.5, 0.999), weight_decay=1e-3)
    _step(
        net,
        adam,
        torch.randn(16, 1, 8, 8),
        torch.randint(0, 10, (16,)),
        net.sample_plans(1.0, differentiable=True),
    )
    return net, adam


def _alpha_step(net: SearchNetwork, adam: torch.optim.Optimizer, seed: int = 0) -> None:
    torch.manual_seed(seed)
    weights = net.weight_parameters()
    for p in weights:
        p.requires_grad_(False)  # as the runner's alpha phase: weights frozen
    try:
        _step(
            net,
            adam,
            torch.randn(16, 1, 8, 8),
            torch.randint(0, 10, (16,)),
            net.sample_plans(1.0, differentiable=True),
        )
    finally:
        for p in weights:
            p.requires_grad_(True)


def test_deepen_gives_the_inserted_cell_its_own_alphas_at_every_position(digits):
    net, adam = _searched_supernet()
    sgd = torch.optim.SGD(net.weight_parameters(), lr=0.01, momentum=0.9)
    x = digits.val.x[:64]
    g = net.derive()
    before_cont = _logits(net, x)
    with torch.no_grad():
        before_geno = net(x, net.genotype_plans(g))
    positions = morphism.deepen_positions(net.spec)
    assert len(positions) >= 3  # start, between cells, end
    for pos in positions:
        morph = morphism.deepen(net, pos)
        grown, key = morph.net, f"cell{pos}"
        assert grown.spec.cells[pos].own_alphas and grown.spec.cells[pos].residual
        assert grown.spec.alpha_keys == ("normal", "reduce", key)
        own = grown.alphas[key]
        assert torch.equal(own, net.alphas["normal"]) and own is not grown.alphas["normal"]
        assert morph.names[f"alphas.{key}"] == "alphas.normal"
        # The optimizers after growth: the own alphas in the alpha optimizer exactly once, never
        # in the weight one.
        new_adam = morphism.remap_optimizer(adam, net, grown.alpha_parameters(), morph)
        new_sgd = morphism.remap_optimizer(sgd, net, grown.weight_parameters(), morph)
        held = [p for group in new_adam.param_groups for p in group["params"]]
        assert sum(p is own for p in held) == 1
        assert not any(p is own for group in new_sgd.param_groups for p in group["params"])
        assert not any(p is own for p in grown.weight_parameters())
        # Adam's state goes with the copy (see deepen), as separate tensors.
        state, normal_state = new_adam.state[own], adam.state[net.alphas["normal"]]
        assert (
            torch.equal(state["exp_avg"], normal_state["exp_avg"])
            and state["exp_avg"] is not normal_state["exp_avg"]
        )
        # Function preserved: every op of every edge, and the genotype's path.
        assert (_logits(grown, x) - before_cont).abs().max().item() <= TOL
        carried = morph.carry(g)
        assert carried.own_cells == ((pos, g.normal, g.normal_concat),)
        with torch.no_grad():
            assert (grown(x, grown.genotype_plans(carried)) - before_geno).abs().max().item() <= TOL
        assert grown.derive() == carried  # the copy derives the normal cell's ops
        # Trained separately: with the gate open, an alpha step moves the two matrices apart.
        with torch.no_grad():
            grown.gates[str(pos)].fill_(0.5)
        _alpha_step(grown, new_adam)
        assert own.grad is not None and own.grad.abs().sum() > 0
        assert not torch.allclose(own.grad, grown.alphas["normal"].grad)
        assert not torch.equal(own, grown.alphas["normal"])


def test_own_alphas_get_no_gradient_while_the_gate_is_closed():
    net, _ = _searched_supernet()
    grown = morphism.deepen(net, 2).net
    grown.train()
    F.cross_entropy(
        grown(torch.randn(8, 1, 8, 8), grown.sample_plans(1.0, differentiable=True)),
        torch.randint(0, 10, (8,)),
    ).backward()
    assert grown.alphas["cell2"].grad is not None and not grown.alphas["cell2"].grad.any()
    assert grown.alphas["normal"].grad.any()


def test_second_deepen_before_the_first_moves_its_alpha_key_and_keeps_its_values(digits):
    net, adam = _searched_supernet()
    last = len(net.spec.cells)
    first = morphism.deepen(net, last)
    net1 = first.net
    adam1 = morphism.remap_optimizer(adam, net, net1.alpha_parameters(), first)
    with torch.no_grad():
        net1.gates[str(last)].fill_(0.5)
        net1.alphas[f"cell{last}"].copy_(
            torch.randn_like(net1.alphas["normal"])
        )  # learned on its own
    _alpha_step(net1, adam1)
    own_values = net1.alphas[f"cell{last}"].detach().clone()
    g1 = net1.derive()
    assert [i for i, _, _ in g1.own_cells] == [last]
    x = digits.val.x[:64]
    before = _logits(net1, x)

    second = morphism.deepen(net1, 0)
    net2 = second.net
    assert net2.spec.alpha_keys == ("normal", "reduce", "cell0", f"cell{last + 1}")
    assert torch.equal(net2.alphas[f"cell{last + 1}"], own_values)  # moved, not reset
    assert torch.equal(net2.alphas["cell0"], net1.alphas["normal"])
    assert torch.equal(net2.gates[str(last + 1)], net1.gates[str(last)])
    assert second.names[f"alphas.cell{last + 1}"] == f"alphas.cell{last}"
    adam2 = morphism.remap_optimizer(adam1, net1, net2.alpha_parameters(), second)
    assert torch.equal(
        adam2.state[net2.alphas[f"cell{last + 1}"]]["exp_avg"],
        adam1.state[net1.alphas[f"cell{last}"]]["exp_avg"],
    )
    assert (_logits(net2, x) - before).abs().max().item() <= TOL
    # The genotype follows its cells: the first own cell renumbered, the new one added.
    g2 = second.carry(g1)
    assert [i for i, _, _ in g2.own_cells] == [0, last + 1]
    assert g2.cell(f"cell{last + 1}") == g1.cell(f"cell{last}") and g2.cell("cell0") == g1.normal
    assert net2.derive() == g2
    with torch.no_grad():
        net1.eval(), net2.eval()
        assert (
            net2(x, net2.genotype_plans(g2)) - net1(x, net1.genotype_plans(g1))
        ).abs().max().item() <= TOL


def test_sampled_and_continuous_plans_cover_own_alphas_and_w_training_never_samples_none():
    net, _ = _searched_supernet()
    grown = morphism.deepen(net, 2).net
    none = grown.spec.primitives.index("none")
    with torch.no_grad():
        grown.alphas["cell2"][:, none] = 50.0  # the own cell wants 'none' everywhere
    hard = grown.sample_plans(1.0, differentiable=True)
    assert (
        set(hard)
        == set(grown.continuous_plans())
        == set(grown.genotype_plans(grown.derive()))
        == {"normal", "reduce", "cell2"}
    )
    assert all(
        choices[0][0] == none for choices in hard["cell2"]
    )  # alpha-training samples by the own alphas
    for _ in range(5):
        plans = grown.sample_plans(1.0, differentiable=False)
        assert all(choices[0][0] != none for choices in plans["cell2"])


def test_derive_of_a_deepened_net_describes_its_own_cell():
    net, _ = _searched_supernet()
    grown = morphism.deepen(net, 2).net
    prims = grown.spec.primitives
    with torch.no_grad():
        grown.alphas["cell2"].zero_()
        grown.alphas["cell2"][:, prims.index("skip_connect")] = 5.0
    g = grown.derive()
    assert [i for i, _, _ in g.own_cells] == [2]
    assert all(op == "skip_connect" for node in g.cell("cell2") for op, _ in node)
    assert g.normal == net.derive().normal and g.reduce == net.derive().reduce
    text = str(g)
    assert text.startswith(str(net.derive()) + " ; cell2: skip_connect(")
    assert Genotype.parse(text) == g and Genotype.from_json(g.to_json()) == g
    # The derived network runs the own cell's ops: skip_connect has no weights, sep_conv does.
    sep = g.replace_op("cell2", 0, g.cell("cell2")[0][0][1], "sep_conv_3x3")
    assert grown.count_derived(sep) > grown.count_derived(g)
    assert distance(g, sep) == 1 and [c.cell for c in diff(g, sep)] == ["cell2"]


def test_mutation_edits_reach_own_cells_and_the_result_runs():
    net, _ = _searched_supernet()
    grown = morphism.deepen(net, 2).net
    g = grown.derive()
    torch.manual_seed(0)
    mutated, edits = mutate(g, dict(grown.alphas.items()), grown.spec.primitives, 1.0, 1.0)
    assert len(edits) == g.num_edges and "cell2" in {e.cell for e in edits}
    assert mutated.cell("cell2") != g.cell("cell2") and [i for i, _, _ in mutated.own_cells] == [2]
    grown(torch.randn(2, 1, 8, 8), grown.genotype_plans(mutated))


def test_genotype_with_an_own_cell_the_network_lacks_is_refused():
    net, _ = _searched_supernet()
    g = morphism.deepen(net, 2).net.derive()
    with pytest.raises(ValueError, match="cell2"):
        net.genotype_plans(g)


def test_deepened_net_saves_and_loads_to_the_same_logits_and_genotype(tmp_path, digits):
    net, _ = _searched_supernet()
    grown = morphism.deepen(morphism.deepen(net, 2).net, 0).net
    with torch.no_grad():
        for key in ("cell0", "cell3"):
            grown.alphas[key].copy_(torch.randn_like(grown.alphas[key]))
        for gate in grown.gates.values():
            gate.fill_(0.5)
    path = ckpt.save(
        {"spec": grown.spec.to_dict(), "model": grown.state_dict()}, tmp_path / "net.pt"
    )
    state = ckpt.load(path)
    loaded = SearchNetwork(ArchSpec.from_dict(state["spec"]))
    loaded.load_state_dict(state["model"])
    assert loaded.spec == grown.spec and loaded.spec.alpha_keys == (
        "normal",
        "reduce",
        "cell0",
        "cell3",
    )
    g = grown.derive()
    assert loaded.derive() == g and len(g.own_cells) == 2
    x = digits.val.x[:64]
    grown.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(x, loaded.genotype_plans(g)), grown(x, grown.genotype_plans(g)))
        assert torch.equal(loaded(x, loaded.continuous_plans()), grown(x, grown.continuous_plans()))


def test_specs_saved_before_own_alphas_still_load():
    net, _ = _searched_supernet()
    d = morphism.deepen(net, 2).spec.to_dict()
    for cell in d["cells"]:
        del cell["own_alphas"]  # a checkpoint written before the field existed
    spec = ArchSpec.from_dict(d)
    assert spec.cells[2].residual and not spec.cells[2].own_alphas
    old_style = SearchNetwork(spec)
    assert spec.alpha_keys == ("normal", "reduce") and set(old_style.alphas) == {"normal", "reduce"}
    old_style(
        torch.randn(2, 1, 8, 8), old_style.genotype_plans(old_style.derive())
    )  # the residual cell shares the normal alphas


def test_runner_deepens_with_own_alphas_and_resumes_exactly(tiny_cfg, digits, tmp_path):
    cfg = tiny_cfg.replace(
        **{
            "growth.policy": "deepen",
            "mutation.strength": 0.5,
            "search.cycles": 2,
            "search.final_genotype": "last",
            "data.train_subset": 64,  # one W-step an epoch: growth is what is checked here
        }
    )
    rec = Recorder()
    runner = Runner(cfg, [rec], checkpoint_dir=tmp_path)  # loads the subset cfg names
    runner.run()
    events = rec.of("growth")
    assert [e.kind for e in events] == ["deepen"] * 4
    assert all(e.preservation_error <= TOL for e in events)
    own = [i for i, c in enumerate(runner.spec.cells) if c.own_alphas]
    assert len(own) == 4 and runner.net.spec.alpha_keys[2:] == tuple(f"cell{i}" for i in own)
    # Every genotype the run holds names exactly the network's own cells, and the cycle ends
    # report it.
    for g in [runner.state.genotype, runner.state.derived, *runner.state.cycle_genotypes]:
        assert [i for i, _, _ in g.own_cells] == own
    assert [len(e.genotype.own_cells) for e in rec.of("cycle_end")] == [2, 4]
    # The optimizers: own alphas in the alpha one, each once, with Adam state; none in the
    # weight one.
    alpha_ids = [id(p) for group in runner.alpha_opt.param_groups for p in group["params"]]
    weight_ids = {id(p) for group in runner.weight_opt.param_groups for p in group["params"]}
    for i in own:
        p = runner.net.alphas[f"cell{i}"]
        assert alpha_ids.count(id(p)) == 1 and id(p) not in weight_ids
        assert "exp_avg" in runner.alpha_opt.state[p]
    # Cycle 1's alpha-training trained cycle 0's two cells' alphas apart from the normal ones;
    # cycle 1's two cells came after the last alpha phase and are still copies of them.
    same = [torch.equal(runner.net.alphas[f"cell{i}"], runner.net.alphas["normal"]) for i in own]
    assert sorted(same) == [False, False, True, True]
    resumed = Runner.resume(tmp_path / "checkpoint.pt")
    assert resumed.spec == runner.spec and resumed.state.genotype == runner.state.genotype
    assert resumed.net.derive() == runner.net.derive()
    x = digits.val.x[:64]
    assert torch.equal(resumed._logits(x), runner._logits(x))
