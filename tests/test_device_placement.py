"""Device placement: every tensor a run creates lives on the run's device.

Runs on a fake CUDA device here (tests/fake_cuda.py: forward passes raise on a
tensor left on another device) and on a real GPU with ``ASOLAB_TEST_DEVICE=cuda
pytest -m device`` (then backward and optimizer steps run too). Each test
drives the code path a run takes: ``build_network`` (what the Runner builds),
``Speed.forward_loss`` (what its steps run), growth through ``growth.propose``,
a checkpoint through ``Runner.resume``.
"""

from __future__ import annotations

import ast
import gc
import time
from pathlib import Path

import pytest
import torch
from fake_cuda import REAL_DEVICE, is_fake, on_device

import asolab
from asolab import config
from asolab.data import Augmentation, Batches, load_data
from asolab.evolution import growth
from asolab.runner import cycle
from asolab.runner.device import memory_format, normalise_device
from asolab.runner.gpubusy import GpuBusy
from asolab.runner.memory import memory_stats
from asolab.runner.resume import CHECKPOINT_NAME
from asolab.runner.speed import Speed, build_network
from asolab.space.fixed import FixedNetwork
from asolab.space.network import DerivedNetwork
from asolab.space.sampling import FairPaths, gumbel_softmax_st
from asolab.space.spec import ArchSpec
from asolab.tracking import layout as L

pytestmark = [
    pytest.mark.device,
    # without a driver torch turns autocast and the fp16 scaler off, and says so
    pytest.mark.filterwarnings("ignore:.*CUDA is not available"),
]

TEMPERATURES = (5.0, 1.0, 0.1)
PACKAGE = Path(asolab.__file__).parent


def _cfg(**overrides) -> config.ExperimentConfig:
    base = {"threads": 1, "tracking.enabled": False, "space.init_channels": 4}
    return config.load(None, {**base, **overrides})


def _spec(cfg: config.ExperimentConfig) -> ArchSpec:
    return ArchSpec.from_config(cfg.space, 1, 10)


def _batch(device: torch.device, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 1, 8, 8, device=device), torch.randint(0, 10, (n,), device=device)


def same(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one: ``cuda`` is ``cuda:<current index>`` (on a GPU and
    on the fake device alike, a tensor reports ``cuda:0`` where the config said ``cuda``)."""
    return normalise_device(a) == normalise_device(b)


def _on(module: torch.nn.Module, device: torch.device) -> set[str]:
    """Names of the parameters and buffers of ``module`` that are not on ``device``."""
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return {name for name, t in tensors if not same(t.device, device)}


def _step(speed: Speed, net, x, y, plans, optimizer) -> torch.Tensor:
    """A training step's forward (and on a real device its backward and update)."""
    loss, logits = speed.forward_loss(net, x, y, plans)
    assert logits.device == x.device and logits.dtype == torch.float32
    assert loss.dtype == torch.float32  # the loss stays fp32 whatever the autocast
    if not is_fake():
        speed.step(loss, optimizer)
    return logits


@pytest.mark.parametrize("channels_last", [False, True])
def test_supernet_is_built_on_the_device(channels_last):
    cfg = _cfg()
    with on_device() as device:
        spec = _spec(cfg)
        net = build_network(spec, device, memory_format(channels_last, device, spec))
        assert _on(net, device) == set()
        assert same(net(*_batch(device)[:1], net.sample_plans(1.0, False)).device, device)


@pytest.mark.parametrize("autocast", ["off", "bf16", "fp16"])
def test_w_step_and_alpha_step_forward_at_several_temperatures(autocast):
    cfg = _cfg(**{"speed.autocast": autocast})
    with on_device() as device:
        spec = _spec(cfg)
        net = build_network(spec, device, memory_format(False, device, spec))
        speed = Speed(cfg.speed, device)
        weights = torch.optim.SGD(net.weight_parameters(), lr=0.01)
        alphas = torch.optim.Adam(net.alpha_parameters(), lr=0.01)
        x, y = _batch(device)
        fair = FairPaths(net.trainable_ops())
        for tau in TEMPERATURES:
            _step(speed, net, x, y, net.sample_plans(tau, differentiable=False), weights)
            plans = net.sample_plans(tau, differentiable=True)
            # the straight-through weights (the Gumbel sample) are fp32 on the device
            weight = next(w for plan in plans.values() for edge in plan for _, w in edge)
            assert same(weight.device, device) and weight.dtype == torch.float32
            _step(speed, net, x, y, plans, alphas)
        _step(speed, net, x, y, net.fair_plans(fair), weights)
        assert _on(net, device) == set()


def _graphs_setup(device: torch.device, graphs: bool):
    """A supernet on ``device``, its speed switches with ``speed.cuda_graphs`` as given,
    and an SGD optimizer on its weights."""
    cfg = _cfg(**{"speed.cuda_graphs": graphs, "space.init_channels": 8})
    spec = _spec(cfg)
    net = build_network(spec, device, memory_format(True, device, spec))
    weights = torch.optim.SGD(net.weight_parameters(), lr=0.05, momentum=0.9)
    return net, Speed(cfg.speed, device), weights


def _retrain_steps(model, speed: Speed, weights, x, y, steps: int = 3) -> list[float]:
    """W-retraining's steps of ``model`` (a fixed network as ``speed`` runs it): the losses."""
    losses = []
    for _ in range(steps):
        loss, _ = speed.forward_loss(model, x, y)
        speed.step(loss, weights)
        losses.append(loss.item())
    return losses


@pytest.mark.skipif(is_fake(), reason="CUDA graphs are captured on a real GPU only")
def test_cuda_graphs_replay_what_the_eager_steps_compute():
    """``speed.cuda_graphs`` on the GPU: three W-retraining steps of a fixed network
    through a captured graph pair against eager ones from the same start. cuDNN's
    convolutions run in TF32 by default, and its algorithm choice may differ between
    the two, so they agree to TF32's precision, not to the bit."""
    losses = {}
    for graphs in (False, True):
        with on_device() as device:
            torch.manual_seed(0)
            net, speed, weights = _graphs_setup(device, graphs)
            x, y = _batch(device, 16)
            model = speed.compiled(FixedNetwork(net, net.derive()))
            losses[graphs] = _retrain_steps(model, speed, weights, x, y)
            assert _on(net, device) == set()
            assert (speed.graphs is not None and speed.graphs.captures == 1) == graphs
    assert losses[True] == pytest.approx(losses[False], rel=2e-3)


@pytest.mark.skipif(is_fake(), reason="CUDA graphs are captured on a real GPU only")
def test_a_second_capture_over_the_same_weights_succeeds():
    """W-retraining's network, then the final stage's, over the same supernet weights:
    two captures, the first pair still uncollected (the garbage collector is off, as it
    may happen to be between two phases). On the H100 such a second capture failed and
    left the process's CUDA random numbers failing."""
    with on_device() as device:
        net, speed, weights = _graphs_setup(device, True)
        x, y = _batch(device, 16)
        genotype = net.derive()
        gc.disable()
        try:
            for _ in range(2):  # a phase each
                _retrain_steps(speed.compiled(FixedNetwork(net, genotype)), speed, weights, x, y)
        finally:
            gc.enable()
        assert speed.graphs is not None
        assert (speed.graphs.captures, speed.graphs.failures) == (2, 0)
        assert torch.isfinite(torch.randn(4, device=device)).all()  # its RNG still works


@pytest.mark.skipif(is_fake(), reason="NVML reads a real GPU's driver")
def test_gpu_busy_reads_the_gpu_the_run_is_on():
    """runner/gpubusy.py finds the run's GPU in NVML (by UUID) and reads it busy while
    matrix products keep it so for two seconds, and idle after."""
    with on_device() as device:
        busy = GpuBusy.open(device)
        assert busy is not None
        try:
            mark, a = busy.mark(), torch.randn(4096, 4096, device=device)
            end = time.perf_counter() + 2.0
            while time.perf_counter() < end:
                for _ in range(20):
                    a = torch.tanh(a @ a)
                torch.cuda.synchronize(device)
            assert (busy.since(mark) or 0.0) > 50.0
            time.sleep(2.0)
            mark = busy.mark()
            time.sleep(2.0)
            assert (busy.since(mark) or 0.0) < 50.0
        finally:
            busy.close()


@pytest.mark.skipif(is_fake(), reason="the CUDA allocator's figures need a real GPU")
def test_memory_stats_on_the_gpu_say_what_the_process_holds():
    """A run's memory metrics on a GPU: allocated, its peak, and the peak the process
    held from the GPU (torch's cache included), which bounds the workers beside it."""
    with on_device() as device:
        block = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
        stats = memory_stats(device)
        del block
        assert set(stats) <= set(L.MEMORY_METRICS)
        assert stats["cuda_peak_reserved_mb"] >= stats["cuda_peak_mb"] >= 64.0


@pytest.mark.skipif(is_fake(), reason="a GPU's kernels decide this")
def test_a_deterministic_run_on_the_gpu_repeats_itself_to_the_bit():
    """speed.deterministic: two runs of one config on the GPU give the same losses and
    accuracies, epoch by epoch (growth and mutation included)."""
    from asolab.runner import Runner
    from asolab.runner.events import Recorder

    seen = []
    with on_device() as device:
        for _ in range(2):
            cfg = _cfg(
                device=str(device),
                **{"speed.deterministic": True, "search.cycles": 1, "search.final_epochs": 1},
                **{"data.train_subset": 128, "growth.policy": "widen"},
            )
            recorder = Recorder()
            Runner(cfg, [recorder]).run()
            seen.append([(e.train_loss, e.val_loss, e.val_acc) for e in recorder.of("epoch_end")])
    assert seen[0] == seen[1]


def test_devices_are_compared_with_their_index():
    """A config's ``cuda`` and a tensor's ``cuda:0`` are one device only after
    normalising: torch says they differ (what failed 12 placement tests on an H100),
    and the fake device reproduces it."""
    with on_device() as device:
        t = torch.zeros(1, device=device)
        if device.index is None:
            assert t.device != device
        assert same(t.device, device) and normalise_device(device).index is not None
    assert normalise_device("cpu") == torch.device("cpu")


def test_gumbel_noise_is_drawn_on_the_device():
    with on_device() as device:
        logits = torch.zeros(14, 8, device=device)
        hard, index = gumbel_softmax_st(logits, 0.5)
        assert same(hard.device, device) and same(index.device, device)


def test_derived_network_runs_on_the_device():
    cfg = _cfg()
    with on_device() as device:
        spec = _spec(cfg)
        net = build_network(spec, device, memory_format(True, device, spec))
        genotype = net.derive(cfg.search.param_free_cap)
        derived = DerivedNetwork(net, genotype).eval()
        x, _ = _batch(device)
        with torch.no_grad():
            assert same(derived(x).device, device)
        net.recalibrate_batchnorm(genotype, [x])
        assert _on(net, device) == set()


@pytest.mark.parametrize("kind, index", [*((kind, 0) for kind in growth.KINDS), ("widen", 1)])
def test_every_growth_step_stays_on_the_device(kind, index):
    """Widen, deepen, branch (as the runner proposes them), then a forward; on
    ``cuda:1`` too, where a module put on "the" GPU (``.cuda()``) lands on the wrong one."""
    if not is_fake() and index >= torch.cuda.device_count():
        pytest.skip(f"this machine has no cuda:{index}")
    cfg = _cfg()
    with on_device(index) as device:
        spec = _spec(cfg)
        net = build_network(spec, device, memory_format(True, device, spec))
        x, _ = _batch(device)
        net = growth.propose(net, kind, 1.0).net
        assert _on(net, device) == set(), f"{kind} left tensors off {device}"
        for differentiable in (False, True):
            assert same(net(x, net.sample_plans(1.0, differentiable)).device, device)
        with torch.no_grad():
            assert same(net.eval()(x, net.genotype_plans(net.derive())).device, device)


def test_data_batches_and_augmentation_on_the_device():
    cfg = _cfg(**{"data.train_subset": 64})
    with on_device() as device:
        data = load_data(cfg.data, 0, device)
        for split in (data.train, data.val, data.test, data.full_train):
            assert same(split.x.device, device) and same(split.y.device, device)
        shuffle = torch.Generator().manual_seed(0)
        augment = Augmentation(shift=2, flip=True)
        batches = list(Batches(data.train, 16, shuffle, augment))
        assert len(batches) == 4
        for x, y in batches:
            assert same(x.device, device) and same(y.device, device)
            assert x.shape == (16, 1, 8, 8)


def test_checkpoint_restored_onto_the_device(tmp_path, monkeypatch):
    """A checkpoint written by a CPU run resumes on the GPU (the path a study's
    retry or a moved run takes): weights, optimizer state and data on the device."""
    cfg = _cfg(
        **{
            "device": "cpu",
            "search.cycles": 1,
            "search.final_epochs": 0,
            "data.train_subset": 64,
            "growth.policy": "widen",
        }
    )
    cpu = cycle.Runner(cfg, checkpoint_dir=tmp_path)
    for _ in range(3):  # w_train, alpha, mutate (with growth): a grown checkpoint
        cpu.next_phase()
    path = tmp_path / CHECKPOINT_NAME
    state = torch.load(path, weights_only=True)
    state["config"]["device"] = "cuda:0" if is_fake() else REAL_DEVICE
    torch.save(state, path)
    with on_device() as device:
        if is_fake():
            # What a GPU machine would answer: the device exists and has room.
            monkeypatch.setattr(cycle, "resolve_device", lambda name: normalise_device(device))
            monkeypatch.setattr(cycle, "check_fits", lambda *args: None)
        runner = cycle.Runner.resume(path)
        assert runner.spec == cpu.spec  # the grown size
        assert _on(runner.net, device) == set()
        for opt in (runner.weight_opt, runner.alpha_opt):
            for s in opt.state.values():
                assert all(same(v.device, device) for v in s.values() if v.dim() > 0)
        x = runner.data.val.head(4).x
        assert same(x.device, device)
        with torch.no_grad():
            out = runner.net(x, runner.net.genotype_plans(runner.state.genotype))
        assert same(out.device, device)


# ---------------------------------------------------------------------------- static check

FACTORIES = {
    "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange",
    "tensor", "eye", "linspace", "Generator", "normal", "bernoulli", "multinomial",
}  # fmt: skip

# Factory calls without a device that are right where they are: host-side values
# (random picks, shuffling orders, channel mappings, normalisation constants) that
# are read on the CPU or moved explicitly, and module constructors, which
# build_network and growth run under torch.device(the run's device). A new entry
# needs a reason; anything else without device= is a tensor born on the CPU.
HOST_SIDE = {
    ("data/core.py", "Augmentation.__call__", "rand"): "flip mask, moved with .to(x.device)",
    ("data/core.py", "Augmentation.__call__", "randint"): "shifts, moved in _translate",
    ("data/core.py", "Batches.__iter__", "randperm"): "shuffling order, moved with .to(device)",
    ("data/load.py", "load_data", "tensor"): "mean/std applied on the CPU before the move",
    ("evolution/growth.py", "*", "randint"): "which cell/edge to grow: a host decision",
    ("evolution/growth.py", "*", "randperm"): "edge order: a host decision",
    ("evolution/mutation.py", "*", "randperm"): "which edges to edit: a host decision",
    ("space/sampling.py", "FairPaths.draw", "randperm"): "op order, read with .tolist()",
    ("evolution/morphism.py", "wider_mapping", "randint"): "channel mapping, host-side",
    ("evolution/morphism.py", "wider_mapping", "arange"): "channel mapping, host-side",
    ("evolution/morphism.py", "widen_conv_weight", "arange"): "channel mapping, host-side",
    ("runner/cycle.py", "Runner.__init__", "Generator"): "batch order and augmentation",
    ("evolution/selection.py", "_paths", "Generator"): "path draws, read with .tolist()",
    ("evolution/selection.py", "_paths", "multinomial"): "on the alphas moved to the CPU",
    ("space/flops.py", "network_size", "zeros"): "a probe through its own CPU network",
    ("runner/memory.py", "*", "zeros"): "memory estimate on the meta device",
    ("space/network.py", "SearchNetwork.__init__", "*"): "built under torch.device(run's)",
    ("space/cells.py", "SearchCell.__init__", "*"): "built under torch.device(run's)",
    ("space/ops.py", "_checked", "*"): "a plugin op's shape probe at registration, on the CPU",
    ("space/ops.py", "build_op", "zeros"): "a plugin op's probe, under the cell's torch.device",
    ("tracking/predictor.py", "*", "tensor"): "a loaded model predicts on the CPU",
}


def _factory_calls(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(enclosing function, factory, line) of each ``torch.<factory>(...)`` without
    ``device=``, and of each ``.cuda()``."""
    found = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = [*scope, child.name]
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                f = child.func
                where = ".".join(scope) or "<module>"
                keywords = {k.arg for k in child.keywords}
                torch_call = isinstance(f.value, ast.Name) and f.value.id == "torch"
                if torch_call and f.attr in FACTORIES and "device" not in keywords:
                    found.append((where, f.attr, child.lineno))
                if f.attr == "cuda" and not child.args and not child.keywords:
                    found.append((where, ".cuda()", child.lineno))
            visit(child, inner)

    visit(tree, [])
    return found


def _allowed(path: str, where: str, factory: str) -> bool:
    return (
        any((path, w, f) in HOST_SIDE for w in (where, "*") for f in (factory, "*"))
        and factory != ".cuda()"
    )


def test_no_tensor_is_created_off_the_run_device():
    """Every torch factory call in the package names its device, or is a listed
    host-side value; nothing calls ``.cuda()`` (the device setting decides)."""
    offending = []
    for file in sorted(PACKAGE.rglob("*.py")):
        rel = file.relative_to(PACKAGE).as_posix()
        for where, factory, line in _factory_calls(ast.parse(file.read_text())):
            if not _allowed(rel, where, factory):
                offending.append(f"{rel}:{line} {where}: torch.{factory} without device=")
    assert not offending, "\n".join(offending)
    # and the rule finds what it looks for
    planted = "def f(x):\n    return x + torch.empty(x.shape).exponential_()\n"
    assert _factory_calls(ast.parse(planted)) == [("f", "empty", 2)]
