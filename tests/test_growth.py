"""Function-preserving growth: widen, deepen, branch on plain nets, the supernet and the runner."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from asolab import config
from asolab.config import GrowthConfig
from asolab.evolution import growth, morphism
from asolab.runner.cycle import Runner
from asolab.runner.events import Recorder
from asolab.space.network import SearchNetwork
from asolab.space.spec import ArchSpec

TOL = 1e-4
PRIMITIVE_SETS = [
    ("sep_conv_3x3", "skip_connect"),
    ("none", "max_pool_3x3", "dil_conv_5x5"),
    config.ALL_PRIMITIVES,
]


# ---------------------------------------------------------------------------- plain conv-BN-ReLU fixture


def _plain(widths: tuple[int, int, int]) -> nn.Sequential:
    a, b, c = widths
    return nn.Sequential(
        nn.Conv2d(3, a, 3, padding=1, bias=False), nn.BatchNorm2d(a), nn.ReLU(),
        nn.Conv2d(a, b, 3, stride=2, padding=2, dilation=2, groups=2, bias=True), nn.BatchNorm2d(b), nn.ReLU(),
        nn.Conv2d(b, b, 3, padding=1, groups=b, bias=False), nn.BatchNorm2d(b), nn.ReLU(),  # depthwise
        nn.Conv2d(b, c, 1, bias=True), nn.BatchNorm2d(c), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 5),
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
    print(f"plain net widened 12 -> 18: params {params_before} -> {params_after}, max|dlogits| {(after - before).abs().max():.2e}")
    assert (after - before).abs().max().item() <= 1e-5
    assert params_after > params_before
    conv = net[3]
    assert (conv.stride, conv.padding, conv.dilation, conv.groups, conv.out_channels) == ((2, 2), (2, 2), (2, 2), 2, 18)
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


@pytest.fixture(scope="module", params=range(len(PRIMITIVE_SETS)), ids=["sep+skip", "none+pool+dil5", "all"])
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
            out.append(morphism.widen_cell(net, i, growth.widened_channels(cs.channels, 0.5, cs.channels % 2 == 0)))
    for pos in morphism.deepen_positions(spec):  # before/after each reduction, start and end
        out.append(morphism.deepen(net, pos))
    op = [p for p in spec.primitives if p != "none"][-1]
    for cell, node, inp in [(0, 0, 0), (1, 0, 0), (1, 1, 2), (3, 1, 1), (4, 0, 1)]:
        out.append(morphism.add_branch(net, cell, node, inp, op))
    return out


def test_every_growth_preserves_logits_on_random_and_digits_inputs(supernet, digits):
    random_x = torch.randn(16, 1, 8, 8)
    digits_x = digits.val.x[:64]
    before_r, before_d = _logits(supernet, random_x), _logits(supernet, digits_x)
    params = supernet.num_weights()
    kinds = set()
    for morph in _growths(supernet):
        err_r = (_logits(morph.net, random_x) - before_r).abs().max().item()
        err_d = (_logits(morph.net, digits_x) - before_d).abs().max().item()
        assert err_r <= TOL and err_d <= TOL, f"{morph.kind} at {morph.where}: {err_r:.2e} / {err_d:.2e}"
        assert morph.net.num_weights() > params, f"{morph.kind} at {morph.where} did not add parameters"
        kinds.add(morph.kind)
    assert kinds == {"widen", "deepen", "branch"}


def test_derived_network_counts_and_calibrates_growth_branches():
    torch.manual_seed(0)
    net = SearchNetwork(ArchSpec.from_config(config.SpaceConfig(init_channels=4, layers=3, steps=2), 1, 10))
    g = net.derive()
    before = net.count_derived(g)
    grown = morphism.add_branch(net, 0, 1, 0, "sep_conv_3x3").net  # runs under every plan, genotype plans too
    branch = grown.cells[0].branches[0]
    expected = sum(p.numel() for p in branch.parameters()) + 1  # the op and its gate
    assert grown.count_derived(g) == before + expected
    deeper = morphism.deepen(grown, 1).net
    assert deeper.count_derived(g) > grown.count_derived(g)
    bn = next(m for m in grown.cells[0].branches[0].modules() if isinstance(m, nn.BatchNorm2d))
    _warm_bn(grown, torch.randn(8, 1, 8, 8), plans=grown.genotype_plans(g))  # 3 batches of statistics
    grown.recalibrate_batchnorm(g, [torch.randn(8, 1, 8, 8)])
    assert int(bn.num_batches_tracked) == 1  # the branch's statistics were re-estimated with the path's


def test_widening_reaches_residual_cells_branches_and_classifier():
    net = _supernet(config.ALL_PRIMITIVES)
    morph = morphism.widen_cell(net, 1, 12)  # cell 1 (reduction) feeds residual cell 2 and cells 3, 4
    assert morph.details["cells"] == [1, 2]
    assert [c.channels for c in morph.spec.cells] == [4, 12, 12, 16, 16]
    wide = morphism.widen_cell(net, 4, 24)
    assert wide.net.classifier.in_features == 48
    assert wide.net.cells[4].edges[0].ops[config.ALL_PRIMITIVES.index("sep_conv_3x3")][0][1].groups == 24


def test_widen_rejects_residual_cells_and_odd_reductions():
    net = _supernet(config.ALL_PRIMITIVES)
    with pytest.raises(ValueError, match="residual"):
        morphism.widen_cell(net, 2, 16)
    with pytest.raises(ValueError, match="even"):
        morphism.widen_cell(net, 1, 11)


def _step(net: SearchNetwork, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, plans) -> float:
    net.train()
    loss = F.cross_entropy(net(x, plans), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def test_training_after_growth_and_optimizer_state_carried(digits):
    net = _supernet(config.ALL_PRIMITIVES)
    x, y = digits.train.x[:32], digits.train.y[:32]
    sgd = torch.optim.SGD(net.weight_parameters(), lr=0.01, momentum=0.9)
    adam = torch.optim.Adam(net.alpha_parameters(), lr=3e-3, betas=(0.5, 0.999))
    _step(net, sgd, x, y, net.continuous_plans())  # every op gets a gradient, hence momentum
    _step(net, adam, x, y, net.sample_plans(1.0, differentiable=True))
    for morph in [morphism.widen_cell(net, 3, 24), morphism.deepen(net, 0), morphism.add_branch(net, 4, 1, 0, "sep_conv_5x5")]:
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
            assert torch.equal(p.detach(), fn(old[old_name].detach(), 1) if fn else old[old_name].detach())
        assert checked >= len(old) - 10
        loss = _step(morph.net, new_sgd, x, y, morph.net.sample_plans(1.0, differentiable=False))
        loss2 = _step(morph.net, new_adam, x, y, morph.net.sample_plans(1.0, differentiable=True))
        assert torch.isfinite(torch.tensor([loss, loss2])).all()


# ---------------------------------------------------------------------------- policy


def test_policy_kinds_and_plateau():
    assert growth.growth_kind(GrowthConfig(policy="none"), 0, []) is None
    assert [growth.growth_kind(GrowthConfig(policy="cycle"), c, []) for c in range(4)] == ["widen", "deepen", "branch", "widen"]
    plateau = GrowthConfig(policy="plateau", plateau_patience=2)
    assert growth.growth_kind(plateau, 3, [0.5, 0.6, 0.7]) is None  # still improving
    assert growth.growth_kind(plateau, 3, [0.5, 0.6, 0.55]) is None  # not yet patience cycles of stall
    assert growth.growth_kind(plateau, 3, [0.7, 0.6, 0.65]) == "widen"
    assert growth.growth_steps(0.0) == 1 and growth.growth_steps(0.5) == 2 and growth.growth_steps(1.0) == 3
    assert growth.widened_channels(16, 0.25, True) == 20 and growth.widened_channels(4, 0.1, True) == 6
    assert growth.widened_channels(5, 0.0, False) == 6


# ---------------------------------------------------------------------------- runner


def test_runner_grows_preserves_and_resumes_exactly(tiny_cfg, digits, tmp_path):
    # final_genotype = "last": the finished runner then holds exactly the state of its
    # last checkpoint ("best" may pick and recalibrate an earlier cycle's genotype).
    cfg = tiny_cfg.replace(
        **{"growth.policy": "cycle", "mutation.strength": 0.5, "search.cycles": 3, "search.final_genotype": "last"}
    )
    rec = Recorder()
    runner = Runner(cfg, [rec], checkpoint_dir=tmp_path, data=digits)
    start = runner.net.num_weights()
    runner.run()
    events = rec.of("growth")
    assert [e.kind for e in events] == ["widen", "widen", "deepen", "deepen", "branch", "branch"]
    for e in events:
        assert e.preservation_error <= TOL and e.params_after > e.params_before
        assert e.val_acc_after == pytest.approx(e.val_acc_before, abs=0.01)
    assert runner.net.num_weights() == events[-1].params_after > start
    assert runner.spec == runner.net.spec and len(runner.spec.cells) == 5
    resumed = Runner.resume(tmp_path / "checkpoint.pt", data=digits)
    assert resumed.spec == runner.spec
    x = digits.val.x[:64]
    assert torch.equal(resumed._logits(x), runner._logits(x))


def test_max_params_caps_growth(tiny_cfg, digits):
    cfg = tiny_cfg.replace(**{"growth.policy": "widen", "search.cycles": 1, "growth.max_params": 1})
    rec = Recorder()
    runner = Runner(cfg, [rec], data=digits)
    start = runner.net.num_weights()
    runner.run()
    assert rec.of("growth") == [] and runner.net.num_weights() == start
