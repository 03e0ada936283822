"""Host work per training step: the dispatched-op counts do not grow, the fixed network
computes what the supernet's view computes, compiled or not (bench/step_cost.py,
bench/README.md "On a GPU")."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
import torch.nn.functional as F
from bench_scripts import bench_module

from asolab import config
from asolab.evolution import morphism
from asolab.runner.speed import Speed, build_network
from asolab.space.fixed import FixedNetwork
from asolab.space.spec import ArchSpec

step_cost = bench_module("step_cost")


def test_dispatched_ops_per_step_do_not_grow():
    """Each op is a kernel launch on a GPU, where a search step is bound by launches:
    a change that adds ops per step fails here (then rerun ``bench/step_cost.py
    --write`` and say why in the commit)."""
    published = json.loads(step_cost.OPS_FILE.read_text())["small"]
    counts = step_cost.count_steps(*step_cost.SMALL)
    for step, figures in published.items():
        assert counts[step]["compute"] <= figures["compute"], (step, counts[step]["top"])
        assert counts[step]["total"] <= figures["total"], (step, counts[step]["top"])
    # the W-step runs no more ops than the plain module of its path plus the optimizer
    assert counts["w_step"]["compute"] < 1.7 * counts["retrain_step"]["compute"]


def test_the_graphs_bookkeeping_bench_times_both_sides_of_one_network():
    """bench/step_cost.py's third figure: the graphs' check and the walk it replaced."""
    figures = step_cost.graphs_bookkeeping(2, step_cost.SMALL[0])
    assert set(figures) == {"check_ms", "walk_ms"} and min(figures.values()) > 0


def _grown_net():
    cfg = config.load(None, {"space.init_channels": 4, "space.steps": 2})
    torch.manual_seed(0)
    spec = ArchSpec.from_config(cfg.space, 1, 10)
    net = build_network(spec, torch.device("cpu"), torch.contiguous_format)
    net = morphism.deepen(net, 1).net  # a residual cell with its own alphas
    return morphism.add_branch(net, 0, 1, 0, "sep_conv_3x3").net  # a gated branch


@pytest.mark.parametrize("training", [True, False])
def test_fixed_network_computes_what_the_supernet_view_computes(training):
    net = _grown_net()
    genotype = net.derive()
    fixed = FixedNetwork(net, genotype)
    x = torch.randn(6, 1, 8, 8)
    net.train(training)
    torch.manual_seed(1)
    view = net(x, net.genotype_plans(genotype))
    torch.manual_seed(1)
    assert torch.equal(fixed(x), view)  # the same additions in the same order
    kept = {id(p) for p in net.derived_parameters(genotype)}
    assert {id(p) for p in fixed.parameters()} == kept  # shared weights, not copies


def test_compiled_fixed_network_gives_the_eager_loss(monkeypatch):
    """speed.compile: the compiled network trains the same weights to the same loss.

    TorchDynamo and AOTAutograd compile it, as speed.compile asks, but not Inductor: its
    C++ code generation took 3 minutes of CPU on a cold cache, over half the suite's
    5 minutes, and the kernels it generates are torch's to test."""
    compile_, asked = torch.compile, []

    def compile_without_codegen(model, **kwargs):
        asked.append(kwargs)
        return compile_(model, backend="aot_eager")

    monkeypatch.setattr(torch, "compile", compile_without_codegen)
    net = _grown_net()
    genotype = net.derive()
    eager = FixedNetwork(net, genotype).train()
    speed = Speed(config.SpeedConfig(compile="default"), torch.device("cpu"))
    compiled = speed.compiled(FixedNetwork(net, genotype).train())
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    state = {k: v.clone() for k, v in net.state_dict().items()}
    loss_eager = F.cross_entropy(eager(x), y)
    net.load_state_dict(state)  # BatchNorm statistics as before the eager pass
    loss_compiled = F.cross_entropy(compiled(x), y)
    assert torch.allclose(loss_compiled, loss_eager, rtol=1e-4, atol=1e-5)
    loss_compiled.backward()
    assert all(p.grad is not None for p in FixedNetwork(net, genotype).parameters())
    assert asked == [{"mode": "default"}]


def _sampled_steps(foreach: bool, buffers: bool, n: int = 4):
    """``n`` sampled W-steps (a fresh path each) from seed 0; the network and the ops of
    the last step. ``buffers`` False: torch's SGD as it comes, a buffer made at each
    parameter's first gradient."""
    from asolab.runner import steps

    cfg, net, wopt, _, speed, x, y = step_cost.setup(
        {"space.init_channels": 4}, 8, 4, torch.device("cpu"), foreach=foreach
    )
    if not buffers:
        wopt.state.clear()
    torch.manual_seed(1)
    counter = step_cost.OpCounter()
    for i in range(n):
        plans = net.sample_plans(1.0, False)
        with counter if i == n - 1 else contextlib.nullcontext():
            steps.weight_step(net, speed, wopt, x, y, plans, cfg.search.grad_clip)
    return net, counter.ops


@pytest.mark.parametrize("foreach", [False, True])
def test_zero_momentum_buffers_give_sgds_own_updates(foreach):
    """Every weight starts with a zero momentum buffer (runner/steps.py): the weights
    after sampled steps (new ops met at each) are exactly those of torch's SGD, which
    makes each buffer at the parameter's first gradient."""
    ours, _ = _sampled_steps(foreach, buffers=True)
    torchs, _ = _sampled_steps(foreach, buffers=False)
    for (name, a), b in zip(ours.state_dict().items(), torchs.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_sampled_step_meeting_new_ops_keeps_the_multi_tensor_update():
    """With torch's lazily made buffers, a multi-tensor SGD step (CUDA's default) that
    meets one parameter without a buffer loops over all of them, two kernels each; the
    runner's zero buffers keep it at one kernel per update for the whole step."""
    _, ops = _sampled_steps(True, buffers=True)
    _, lazy = _sampled_steps(True, buffers=False)
    assert lazy["mul_"] > 0 and lazy["clone"] > 0, lazy  # a buffer made, the loop taken
    assert ops["mul_"] == 0 and ops["clone"] == 0, ops
    # (the other multi-tensor multiply is the gradient clipping's, in both)
    assert ops["_foreach_mul_"] == lazy["_foreach_mul_"] + 1, (ops, lazy)


def test_only_sgd_with_momentum_and_no_dampening_gets_zero_buffers():
    """With dampening, SGD's first update is the whole gradient but a zero buffer's would
    be ``(1 - dampening) * g``: such an optimizer, one without momentum and Adam keep
    torch's lazy state."""
    from asolab.runner.steps import with_momentum_buffers

    w = torch.nn.Parameter(torch.ones(3))
    for opt in (
        torch.optim.Adam([w]),
        torch.optim.SGD([w], lr=0.1),
        torch.optim.SGD([w], lr=0.1, momentum=0.9, dampening=0.5),
    ):
        assert not with_momentum_buffers(opt).state, opt
    sgd = with_momentum_buffers(torch.optim.SGD([w], lr=0.1, momentum=0.9))
    assert torch.equal(sgd.state[w]["momentum_buffer"], torch.zeros(3))
