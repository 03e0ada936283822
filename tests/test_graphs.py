"""``speed.cuda_graphs``' rules, on the CPU.

A CUDA graph needs a CUDA device; these tests give :class:`CudaGraphs` a stand-in
capture that does what ``torch.cuda.make_graphed_callables`` does on the host (its
three warm-up runs, then a callable taking the input and the parameters) and
replays eagerly. They check when a pair is captured, kept, captured anew or not
used, that a step through the graphs computes what the eager step computes (the
warm-up's BatchNorm updates put back), and the wiring from the config to the
fixed network of W-retraining and the final stage. ``bench/gpu_check.py``'s ``graphed`` section and
``tests/test_device_placement.py`` check the real captures on a GPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from asolab import config
from asolab.runner import steps
from asolab.runner.graphs import CudaGraphs, Graphed
from asolab.runner.speed import Speed, build_network
from asolab.space.fixed import FixedNetwork
from asolab.space.ops import SepConv
from asolab.space.spec import ArchSpec

CPU = torch.device("cpu")


class StandIn:
    """A capture that runs the module as torch's warm-up does, and replays eagerly."""

    def __init__(self, fail: type[nn.Module] | None = None) -> None:
        self.captured: list[tuple[nn.Module, tuple[int, ...]]] = []
        self.params: list[tuple[nn.Parameter, ...]] = []  # what each pair was given
        self.fail = fail

    def __call__(self, module, x, params):
        if self.fail is not None and isinstance(module, self.fail):
            raise RuntimeError("operation not permitted when stream is capturing")
        sample = x.detach().clone().requires_grad_(x.requires_grad)
        for _ in range(3):  # make_graphed_callables' warm-up: BatchNorm statistics move
            module(sample).sum().backward()
        for p in params:
            p.grad = None
        self.captured.append((module, tuple(x.shape)))
        self.params.append(params)
        return lambda inp, *ps: module(inp)


def _sep_conv() -> SepConv:
    """A supernet's 3x3 separable convolution on 4 channels (BatchNorm without affine)."""
    return SepConv(4, 4, 3, 1, 1, affine=False)


def _net(channels: int = 4):
    cfg = config.load(None, [f"space.init_channels={channels}", "space.layers=3"])
    torch.manual_seed(0)
    net = build_network(ArchSpec.from_config(cfg.space, 1, 10), CPU, torch.contiguous_format)
    return cfg, net


def test_a_pair_is_captured_once_per_module_and_kept_for_other_batch_shapes():
    capture = StandIn()
    graphs = CudaGraphs(capture)
    op = _sep_conv()
    x = torch.randn(8, 4, 6, 6, requires_grad=True)
    graphs(op, x)
    graphs(op, torch.randn(8, 4, 6, 6, requires_grad=True))
    assert [shape for _, shape in capture.captured] == [(8, 4, 6, 6)]
    graphs(op, torch.randn(3, 4, 6, 6, requires_grad=True))  # an epoch's last batch: eager
    graphs(op, x)
    assert len(capture.captured) == 1 and graphs.captures == 1
    with torch.no_grad():  # evaluation runs eagerly
        graphs(op, x)
    op.eval()
    graphs(op, x)
    assert len(capture.captured) == 1


def test_frozen_weights_and_ops_without_kernels_run_eagerly():
    capture = StandIn()
    graphs = CudaGraphs(capture)
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    assert graphs(nn.Identity(), x) is x  # no weights, no buffers: nothing to graph
    op = _sep_conv()
    for p in op.parameters():
        p.requires_grad_(False)  # the alpha phase
    graphs(op, x)
    assert capture.captured == []


def test_the_warm_up_leaves_batchnorm_statistics_as_the_eager_step_would():
    graphs = CudaGraphs(StandIn())
    eager = _sep_conv()
    graphed_op = copy.deepcopy(eager)
    x = torch.randn(8, 4, 6, 6, requires_grad=True)
    assert torch.equal(eager(x), graphs(graphed_op, x))
    for a, b in zip(eager.buffers(), graphed_op.buffers(), strict=True):
        assert torch.equal(a, b)  # without the restore, three more updates


def test_a_module_whose_weights_were_replaced_is_captured_anew():
    """A pair reads the tensors it was captured with: moved ones need a new pair."""
    capture = StandIn()
    graphs = CudaGraphs(capture)
    op = _sep_conv()
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    graphs(op, x)
    graphs(op, x)
    conv = next(m for m in op.modules() if isinstance(m, nn.Conv2d))
    conv.weight.data = conv.weight.data.clone()  # elsewhere in memory now
    graphs(op, x)
    assert [m for m, _ in capture.captured] == [op, op] and graphs.captures == 2


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def test_tensors_replaced_without_torchs_registration_hooks_get_a_new_pair():
    """A step checks the module's listed tensors instead of walking its tree. ``Module.to``
    under torch's overwrite rule swaps Parameter objects (and ``_apply`` buffers) without
    the registration hooks that mark the list stale: the next step must still see them,
    capture anew, and hand the new pair the new parameters."""
    capture = StandIn()
    graphs = CudaGraphs(capture)
    op = _sep_conv()
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    graphs(op, x)
    old = tuple(op.parameters())
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        op.to(memory_format=torch.channels_last)  # new Parameter objects, unannounced
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    assert not any(a is b for a, b in zip(old, op.parameters()))
    graphs(op, x)
    assert graphs.captures == 2 and _same(capture.params[-1], tuple(op.parameters()))
    bn = next(m for m in op.modules() if isinstance(m, nn.BatchNorm2d))
    bn.running_mean = bn.running_mean.clone()  # announced: torch's buffer hook
    graphs(op, x)
    assert graphs.captures == 3


def test_a_submodule_added_after_a_capture_is_in_the_next_pair():
    capture = StandIn()
    graphs = CudaGraphs(capture)
    net = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1))
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    graphs(net, x)
    graphs(net, x)
    net.append(nn.Conv2d(4, 4, 1))  # registered: no tensor of the listed ones moved
    graphs(net, x)
    assert graphs.captures == 2 and _same(capture.params[-1], tuple(net.parameters()))
    assert len(capture.params[-1]) == 4


def test_a_module_that_cannot_be_captured_runs_eagerly_and_is_named_once(caplog):
    graphs = CudaGraphs(StandIn(fail=SepConv))
    op = _sep_conv()
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    with caplog.at_level("WARNING"):
        out = [graphs(op, x) for _ in range(3)]
    assert all(torch.equal(out[0], o) for o in out)
    named = [r.getMessage() for r in caplog.records if "cuda_graphs" in r.getMessage()]
    assert len(named) == 1 and "SepConv runs without a CUDA graph" in named[0]
    assert (graphs.captures, graphs.failures) == (0, 1)
    assert "stream is capturing" in named[0] and "set speed.cuda_graphs = false" in named[0]


def test_fixed_network_steps_through_the_graphs_compute_what_eager_steps_compute():
    """W-retraining's steps of a genotype's fixed network through the stand-in, against
    eager steps from the same start: the same losses and weights to the bit."""
    cfg, eager_net = _net()
    _, graph_net = _net()
    speed, graph_speed = Speed(cfg.speed, CPU), Speed(cfg.speed, CPU)
    graph_speed.graphs = CudaGraphs(StandIn())
    torch.manual_seed(1)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    genotype = eager_net.derive()
    losses = {}
    for name, net, sp in (("eager", eager_net, speed), ("graphs", graph_net, graph_speed)):
        opt, _ = steps.optimizers(net, cfg.search)
        fixed = sp.compiled(FixedNetwork(net, genotype))
        assert isinstance(fixed, Graphed) == (name == "graphs")
        run = [steps.weight_step(fixed, sp, opt, x, y, None, 5.0) for _ in range(3)]
        losses[name] = [loss.item() for loss, _ in run]
    assert graph_speed.graphs.captures == 1  # the whole network, once
    assert losses["eager"] == losses["graphs"]
    for a, b in zip(eager_net.state_dict().values(), graph_net.state_dict().values()):
        assert torch.equal(a, b)


def test_the_setting_changes_nothing_off_cuda_and_is_checked():
    assert not config.load(None, []).speed.cuda_graphs  # opt-in (bench/README.md)
    speed = Speed(config.SpeedConfig(cuda_graphs=True), CPU)
    assert speed.graphs is None
    _, net = _net()
    assert speed.compiled(net) is net
    with pytest.raises(config.ConfigError, match="cuda_graphs"):
        config.load(None, ["speed.cuda_graphs=fixed"])
