"""GPU speed switches on the CPU, and CUDA out-of-memory as a user error.

``speed.autocast`` and ``speed.cudnn_benchmark`` are no-ops here except bf16,
which torch runs on the CPU too; an out-of-memory error raised inside a phase
(by a forward hook, where a real one would strike) ends the run with one line
naming the memory needed and the knobs, exit status 2, and the run resumes.
"""

from __future__ import annotations

import pickle

import torch
from bench_scripts import bench_module
from mlflow import MlflowClient

from asolab import config
from asolab.cli import main
from asolab.runner import Runner, cycle
from asolab.runner.speed import Speed, build_network
from asolab.tracking import layout as L

cudnn_plans = bench_module("cudnn_plans")

TINY = [
    "device=cpu",
    "threads=1",
    "space.init_channels=4",
    "search.cycles=1",
    "search.w_epochs=1",
    "search.alpha_epochs=1",
    "search.retrain_epochs=1",
    "search.final_epochs=0",
    "data.train_subset=96",
]


def _set(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def test_switches_on_the_cpu():
    cpu = torch.device("cpu")
    before = torch.backends.cudnn.benchmark
    fp16 = Speed(config.SpeedConfig(autocast="fp16"), cpu)
    assert fp16.dtype is None and not fp16.scaler.is_enabled()  # fp16 needs CUDA: fp32 here
    assert torch.backends.cudnn.benchmark == before  # a CPU run leaves cuDNN alone
    bf16 = Speed(config.SpeedConfig(autocast="bf16"), cpu)
    assert bf16.dtype is torch.bfloat16 and not bf16.scaler.is_enabled()
    cfg = config.load(None, ["space.init_channels=4"])
    from asolab.space.spec import ArchSpec

    net = build_network(ArchSpec.from_config(cfg.space, 1, 10), cpu, torch.contiguous_format)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    plans = net.sample_plans(1.0, differentiable=True)
    seen = []
    hook = net.stem.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    loss, logits = bf16.forward_loss(net, x, y, plans)
    hook.remove()
    assert seen == [torch.bfloat16]  # the convolutions ran in bf16
    assert logits.dtype == loss.dtype == torch.float32  # the loss did not
    bf16.step(loss, torch.optim.Adam(net.alpha_parameters()))
    assert all(a.dtype == torch.float32 for a in net.alpha_parameters())


def test_a_bf16_run_trains_on_the_cpu(tiny_cfg):
    # loaded by the run itself: TINY's subset (a bundle handed in is used whole)
    result = Runner(tiny_cfg.replace(**{"speed.autocast": "bf16"})).run()
    assert 0.0 <= result.val_acc <= 1.0 and result.cycle_val_acc


def test_out_of_memory_in_a_phase_is_one_line_exit_2_and_the_run_resumes(
    tmp_path, monkeypatch, capsys
):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [*TINY, f"tracking.tracking_uri={store}", "tracking.log_models=false"]
    build = cycle.build_network

    def build_with_a_small_gpu(*args):
        net = build(*args)

        def hook(module, inputs, output):
            if not module.weight.requires_grad:  # alpha-training: the weights are frozen
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        net.stem[0].register_forward_hook(hook)
        return net

    monkeypatch.setattr(cycle, "build_network", build_with_a_small_gpu)
    assert main(["run", "--quiet", *_set(overrides)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("asolab: error: out of memory on cpu at data.batch_size=")
    assert "the supernet needs about" in err and "GiB" in err
    assert "lower space.init_channels" in err and "speed.autocast" in err
    assert "asolab run --resume" in err  # how to continue it
    client = MlflowClient(store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    assert run.data.tags[L.TAG_PHASE] == "cycle 0 / after w_train"

    monkeypatch.setattr(cycle, "build_network", build)  # the memory is there again
    assert main(["run", "--quiet", "--resume", run.info.run_id, *_set(overrides)]) == 0
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


def test_channels_last_keeps_tiny_networks_contiguous_on_the_cpu():
    """oneDNN's channels-last CPU kernels corrupted the heap for cells under 8 channels on an
    AVX2 machine; such networks stay contiguous there, and nowhere else."""
    from asolab import config
    from asolab.runner.device import CPU_CHANNELS_LAST_MIN, memory_format
    from asolab.space.spec import ArchSpec

    def spec(init_channels: int) -> ArchSpec:  # its narrowest cell has init_channels
        space = config.load(None, [f"space.init_channels={init_channels}"]).space
        return ArchSpec.from_config(space, 1, 10)

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert memory_format(True, cpu, spec(CPU_CHANNELS_LAST_MIN - 1)) == torch.contiguous_format
    assert memory_format(True, cpu, spec(CPU_CHANNELS_LAST_MIN)) == torch.channels_last
    assert memory_format(True, gpu, spec(4)) == torch.channels_last
    assert memory_format(False, cpu, spec(64)) == torch.contiguous_format


def test_a_four_channel_run_on_one_thread_completes_with_channels_last_on():
    """The crash itself (aborts or segmentation faults in the backward pass, every time on
    that machine): a whole run of a tiny network in a process of its own (forked from the
    preloaded server of tests/processes.py), so that a crash fails the test, not pytest."""
    import sys

    import processes

    sets = ["threads=1", "space.init_channels=4", "space.steps=1", "search.cycles=1"]
    sets += ["search.w_epochs=1", "search.alpha_epochs=1", "search.retrain_epochs=1"]
    sets += ["search.final_epochs=0", "data.train_subset=150", "speed.channels_last=true"]
    cmd = [sys.executable, "-m", "asolab.cli", "run", "--no-track", "--quiet"]
    cmd += [x for s in sets for x in ("--set", s)]
    proc = processes.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-800:]
    assert "test accuracy" in proc.stdout


def test_cudnn_benchmark_scope_full_batch_times_every_full_batch_plan_and_no_other():
    """``speed.cudnn_benchmark_scope = "full-batch"``: every convolution of a full batch,
    training, evaluation or recalibration, forward or backward, runs a plan cuDNN timed,
    whichever came first; no plan of another batch size is timed. "all" times every
    plan, and autotuning off none."""
    # a tiny run through a model of cuDNN's plan cache (bench/cudnn_plans.py), evaluating
    # in full batches and widening: the growth's evaluation meets the grown cell's
    # shapes before W-retraining's steps do; and a second cycle, whose W-training runs
    # the grown supernet (a new module, which must be watched as the first was)
    full_batch = config.SpeedConfig(cudnn_benchmark_scope="full-batch")
    cache = cudnn_plans.plans_seen(full_batch, [*cudnn_plans.TINY, "search.cycles=2"])
    assert {full for full, *_ in cache.calls} == {True, False}  # both kinds ran
    # a training step's full batch runs a timed plan even where evaluation met its shape
    # first (timing per step, as before, left the grown cell's forward on heuristics)
    assert all(timed for full, timed, training in cache.calls if full and training)
    assert [timed for _, timed, _ in cache.calls] == [full for full, *_ in cache.calls]
    assert len(cache.timed) > sum(cache.timed.values()) > 0
    cuda = torch.device("cuda")
    before = torch.backends.cudnn.benchmark
    try:
        for scope_cfg, switch in [
            (config.SpeedConfig(cudnn_benchmark_scope="all"), True),
            (config.SpeedConfig(cudnn_benchmark=False), False),
        ]:
            net = torch.nn.Conv2d(1, 1, 1)
            Speed(scope_cfg, cuda, 32).watch(net)
            assert torch.backends.cudnn.benchmark is switch and not net._forward_pre_hooks
        # the hook is the batch size's alone: a pickled (or deep-copied) network keeps it
        # without dragging the run's Speed along
        watched = Speed(config.SpeedConfig(), cuda, 32).watch(torch.nn.Conv2d(1, 1, 1))
        clone = pickle.loads(pickle.dumps(watched))
        for batch in (32, 3):
            clone(torch.zeros(batch, 1, 2, 2))
            assert torch.backends.cudnn.benchmark is (batch == 32)
    finally:
        torch.backends.cudnn.benchmark = before


def test_a_deterministic_run_asks_torch_for_deterministic_kernels_and_puts_back_what_was():
    """speed.deterministic: during the run torch's deterministic algorithms (warning on an
    op that has none) and cuDNN's are on, and the classifier's pooling backward, which
    torch flags on CUDA but which is deterministic at 1x1, is not warned about; after the
    run the process is as it was, so a study worker's next trial does not inherit it."""
    import warnings

    from asolab.progress import summary_table
    from asolab.runner.events import Observer, Recorder
    from asolab.runner.speed import POOL_BACKWARD

    class Seen(Observer):
        def __init__(self) -> None:
            self.flags: list[tuple[bool, bool, bool]] = []

        def on_epoch_end(self, event) -> None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.warn(
                    f"{POOL_BACKWARD} does not have a deterministic implementation", stacklevel=1
                )
            # as torch words an op that has none (index_add on CUDA, say): the run notes it
            warnings.warn(
                f"op_{event.epoch} does not have a deterministic implementation", stacklevel=1
            )
            self.flags.append(
                (
                    torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled(),
                    torch.backends.cudnn.deterministic and not caught,
                )
            )

    for on in (True, False):
        seen, recorder = Seen(), Recorder()
        cfg = config.load(None, [*TINY, f"speed.deterministic={str(on).lower()}"])
        with warnings.catch_warnings(record=True):  # the test's own warnings, kept off screen
            warnings.simplefilter("always")
            Runner(cfg, [seen, recorder]).run()
        (end,) = recorder.of("run_end")
        assert end.nondeterministic == (("op_0",) if on else ())
        rows = [r.split() for r in summary_table(end).splitlines()]
        assert (["not", "deterministic", "op_0"] in rows) == on
        assert seen.flags == [(on, on, on)] * len(seen.flags) and len(seen.flags) == 3
        assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cudnn.deterministic
        assert not [f for f in warnings.filters if f[1] and POOL_BACKWARD in f[1].pattern]


def test_asolab_rank_trains_each_genotype_as_deterministic_as_the_config_asks(monkeypatch):
    """``asolab rank``'s stand-alone trainings run phase by phase, not through
    ``Runner.run``: they apply speed.deterministic themselves, and put it back."""
    from asolab.baseline import arms, ranking
    from asolab.data import load_data

    cfg = config.load(None, [*TINY, "speed.deterministic=true"])
    seen = []
    phase = arms.FixedGenotypeRunner.next_phase

    def watched(runner) -> None:
        seen.append(torch.are_deterministic_algorithms_enabled())
        phase(runner)

    monkeypatch.setattr(arms.FixedGenotypeRunner, "next_phase", watched)
    data = load_data(cfg.data, cfg.seed, torch.device("cpu"))
    genotype = Runner(cfg, data=data).net.derive()
    ranking.standalone_val_acc(cfg, genotype, data)
    assert seen and all(seen) and not torch.are_deterministic_algorithms_enabled()


def test_evaluation_on_cuda_meets_one_batch_shape_and_changes_no_figure():
    """On CUDA every pass in eval mode (validation, test, the growth's probe) pads a smaller
    batch with zero images to the run's largest evaluation batch, so that it meets one
    batch shape (each new shape is a cuDNN plan on a GPU); its figures are the unpadded
    ones. A run whose Speed is told it runs on CUDA (as bench/cudnn_plans.py does) against
    the same run on the CPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from asolab.runner.events import Recorder

    class EvalBatches(TorchDispatchMode):
        """The batch sizes of the convolutions run without gradients (eval-mode passes)."""

        def __init__(self) -> None:
            super().__init__()
            self.sizes: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.convolution.default and not torch.is_grad_enabled():
                self.sizes.add(len(args[0]))
            return func(*args, **(kwargs or {}))

    # TINY with a widen (so a probe), and validation and test splits of 288 and 359
    # images evaluated in batches of 320: unpadded, the validation split (and the probe,
    # its head) is one batch of 288 and the test's last batch 39 images. BatchNorm's
    # recalibration also runs without gradients, in training mode, on the training
    # batches (80 images: 32, 32 and 16), unpadded as training's are.
    runs = {}
    before = torch.backends.cudnn.benchmark
    try:
        for told in ("cpu", "cuda"):
            sets = [*cudnn_plans.TINY, "data.eval_batch_size=320"]
            cfg = config.load(None, ["device=cpu", "tracking.enabled=false", *sets])
            recorder, seen = Recorder(), EvalBatches()
            runner = Runner(cfg, [recorder])
            runner.speed = Speed(cfg.speed, torch.device(told), cfg.data.batch_size)
            with seen:
                result = runner.run()
            runs[told] = (result, recorder, seen.sizes)
    finally:
        torch.backends.cudnn.benchmark = before
    (cpu, cpu_events, cpu_sizes), (cuda, cuda_events, cuda_sizes) = runs.values()
    assert cpu_sizes == {32, 16, 288, 320, 39} and cuda_sizes == {32, 16, 320}
    assert (cuda.val_acc, cuda.test_acc) == (cpu.val_acc, cpu.test_acc)
    for kind in ("epoch_end", "growth"):
        assert len(cpu_events.of(kind)) == len(cuda_events.of(kind)) > 0
    for a, b in zip(cpu_events.of("epoch_end"), cuda_events.of("epoch_end"), strict=True):
        assert (a.val_acc, a.train_loss) == (b.val_acc, b.train_loss)
        assert abs(a.val_loss - b.val_loss) <= 1e-5 * max(1.0, abs(a.val_loss))
    (a,), (b,) = cpu_events.of("growth"), cuda_events.of("growth")
    assert a.val_acc_after == b.val_acc_after
    assert abs(a.preservation_error - b.preservation_error) <= 1e-5
