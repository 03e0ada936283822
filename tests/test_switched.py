"""``speed.sampled_graphs``: W-training's step with every edge switched on the device
(``space/switched.py``) moves what the eager step moves, on the CPU (no graphs there:
the same step compiled without them)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
import torch.nn as nn
from bench_scripts import bench_module
from conftest import ONE_CYCLE

from asolab import config
from asolab.runner import steps
from asolab.runner.speed import Speed, build_network
from asolab.space import switched as switching
from asolab.space.spec import ArchSpec
from asolab.space.switched import SwitchedEdges, ungraphable, unswitchable

CPU = torch.device("cpu")


# a branch form of each built-in op kind (dil_conv's is sep_conv's half; skip_connect is a
# FactorizedReduce at stride 2); fewer ops than the default space: a quicker trace
SPACE = {
    "space.init_channels": 4,
    "space.primitives": ["none", "avg_pool_3x3", "skip_connect", "sep_conv_3x3"],
}


def _net(layout: torch.memory_format):
    """Three cells (the middle one a reduction) of two nodes, 4 channels, and a growth
    branch in the first cell, which runs outside the switched edges."""
    cfg = config.load(None, {**SPACE, "space.layers": 3, "space.steps": 2})
    spec = ArchSpec.from_config(cfg.space, 3, 10)
    first = dataclasses.replace(spec.cells[0], branches=((1, 0, "sep_conv_3x3"),))
    spec = dataclasses.replace(spec, cells=(first, *spec.cells[1:]))
    torch.manual_seed(0)
    net = build_network(spec, CPU, layout)
    with torch.no_grad():  # an open gate, so that the branch's weights train too
        net.cells[0].branch_gates[0].fill_(0.5)
    return cfg, net


@pytest.mark.parametrize("layout", [torch.channels_last])  # CUDA's; contiguous in bench
def test_a_switched_w_step_moves_what_the_eager_step_moves(layout):
    """Two steps of each from one start, along the same two paths: the same losses, weights,
    momentum buffers and BatchNorm running statistics (to rounding), and gradients on
    exactly the parameters the eager step gives them (the ops drawn, the rest None)."""
    # the measure bench/gpu_steps.py's switched sections report on a GPU
    rel = bench_module("gpu_steps").largest_rel_diff
    cfg, eager = _net(layout)
    _, switched_net = _net(layout)
    speed, switched = Speed(cfg.speed, CPU), SwitchedEdges(CPU).bind(switched_net)
    opts = [steps.optimizers(n, cfg.search)[0] for n in (eager, switched_net)]
    x = torch.randn(4, 3, 16, 16).contiguous(memory_format=layout)
    y = torch.randint(0, 10, (4,))
    logits = eager.path_logits()
    clip = cfg.search.grad_clip
    for _ in range(2):
        path = eager.sample_path(logits, 1.0)
        loss, _ = steps.weight_step(eager, speed, opts[0], x, y, path, clip)
        twin, _ = steps.weight_step(switched_net, speed, opts[1], x, y, path, clip, switched)
        assert abs(loss.item() - twin.item()) < 1e-6
        drawn = [p.grad is not None for p in eager.parameters()]
        assert [p.grad is not None for p in switched_net.parameters()] == drawn
        assert 0 < sum(drawn) < len(drawn)
    assert rel(zip(eager.parameters(), switched_net.parameters())) < 1e-6
    assert rel(zip(eager.buffers(), switched_net.buffers())) < 1e-5
    momentum = [
        (opts[0].state[p]["momentum_buffer"], opts[1].state[q]["momentum_buffer"])
        for p, q in zip(eager.weight_parameters(), switched_net.weight_parameters())
    ]
    assert rel(momentum) < 1e-4  # one step's gradients, channels-last kernels' rounding


def test_a_network_with_an_op_without_a_branch_form_trains_eagerly_and_says_so(caplog):
    cfg, net = _net(torch.contiguous_format)
    speed = Speed(dataclasses.replace(cfg.speed, sampled_graphs=True), CPU)
    assert speed.switched(net) is not None and unswitchable(net) is None
    net.cells[2].edges[1].ops[3] = nn.Conv2d(4, 4, 3, padding=1)  # a user's op, say
    with caplog.at_level(logging.WARNING):
        assert speed.switched(net) is None and speed.switched(net) is None
    said = [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    assert said == [
        "speed.sampled_graphs: W-training runs eagerly: op 'sep_conv_3x3' (Conv2d, cell 2 "
        "edge 1) has no branch form"
    ]
    assert Speed(cfg.speed, CPU).switched(net) is None  # off by default
    assert not cfg.speed.sampled_graphs
    with pytest.raises(config.ConfigError, match="sampled_graphs"):
        config.load(None, ["speed.sampled_graphs=sometimes"])


def test_without_conditional_nodes_cuda_trains_eagerly_and_says_so(caplog, monkeypatch):
    """torch 2.11 cannot capture a torch.cond in a CUDA graph (on an H100 the capture
    failed): there the setting falls back to the eager step, once said."""
    cfg = dataclasses.replace(config.load(None, []).speed, sampled_graphs=True)
    cuda = torch.device("cuda")  # nothing here touches the device
    net = _net(torch.contiguous_format)[1]
    assert ungraphable(CPU) is None
    # binding touches no device; torch 2.14's CUDA build has conditional nodes
    assert (Speed(cfg, cuda).switched(net) is not None) == switching.CONDITIONAL_NODES
    monkeypatch.setattr(switching, "CONDITIONAL_NODES", False)
    caplog.clear()  # (on a torch without them the Speed above has said it already)
    assert ungraphable(CPU) is None  # off CUDA there is nothing to capture
    with caplog.at_level(logging.WARNING):
        speed = Speed(cfg, cuda)
    assert speed.switched(net) is None
    said = [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    assert said == [
        f"speed.sampled_graphs: W-training runs eagerly: torch {torch.__version__} cannot "
        "capture a torch.cond in a CUDA graph (conditional nodes: torch 2.12 and later)"
    ]


def test_a_run_with_switched_edges_trains_as_the_eager_run(tmp_path):
    """A whole run, W-training switched on the device, against the eager run from the same
    seed: the switched edges ran (compiled), and W-training's loss is the eager one's.

    To rounding, not to the bit: a difference of 1e-7 in a weight can meet a tie (a
    ReLU at zero, a pooling maximum) and move a gradient by 0.6%, as 2 of 12 random
    perturbations of 1e-8 of the eager network's own weights did (docs/development.md),
    so the loss is compared to 1e-3 and the genotype is not."""
    from torch._dynamo.utils import counters

    from asolab.runner import Runner
    from asolab.runner.events import Recorder
    from asolab.runner.phases import W_TRAIN

    losses, traces = {}, {}
    for on in (False, True):
        before = counters["stats"]["unique_graphs"]
        overrides = {**ONE_CYCLE, **SPACE, "data.train_subset": 64, "tracking.enabled": False}
        overrides["speed.sampled_graphs"] = on
        recorder = Recorder()
        cfg = config.load(None, overrides)
        result = Runner(cfg, [recorder], checkpoint_dir=tmp_path / str(on)).run()
        assert result.genotype is not None and 0 < result.val_acc <= 1
        losses[on] = [e.train_loss for e in recorder.of("epoch_end") if e.phase == W_TRAIN]
        traces[on] = counters["stats"]["unique_graphs"] - before
    assert traces[False] == 0 and traces[True] > 0  # the switched edges ran, compiled
    assert len(losses[True]) == len(losses[False]) > 0
    for eager, switched in zip(losses[False], losses[True]):
        assert abs(eager - switched) < 1e-3 * eager
