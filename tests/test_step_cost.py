"""Host work per training step: the dispatched-op counts do not grow, the fixed network
computes what the supernet's view computes, compiled or not (bench/step_cost.py,
bench/README.md "On a GPU")."""

from __future__ import annotations

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
