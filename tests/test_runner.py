"""The ASO-SE cycle: phase semantics, optimizer lifetime, reproducibility, and the
failure modes of earlier ASO-SE implementations as regression tests."""

from __future__ import annotations

import dataclasses
import io
import shutil
import sys
import time

import pytest
import torch
from conftest import TINY, cell_layouts

from asolab import config
from asolab.data import Batches, Split, load_data
from asolab.progress import ProgressObserver
from asolab.runner import Runner
from asolab.runner.events import Recorder
from asolab.runner.phases import PHASES
from asolab.space.network import DerivedNetwork


def _snapshot(params):
    return [p.detach().clone() for p in params]


def _changed(before, params):
    return [not torch.equal(b, p.detach()) for b, p in zip(before, params)]


def test_alpha_training_changes_only_alphas(tiny_cfg):
    r = Runner(tiny_cfg)
    w0, a0 = _snapshot(r.net.weight_parameters()), _snapshot(r.net.alpha_parameters())
    r.alpha_train()
    assert not any(_changed(w0, r.net.weight_parameters()))
    assert all(_changed(a0, r.net.alpha_parameters()))
    assert all(p.requires_grad for p in r.net.weight_parameters())  # unfrozen afterwards


def test_alpha_entropy_says_how_far_the_alphas_have_decided(tiny_cfg):
    """1 while the alphas are uniform, near 0 when each edge has one op, and it falls as
    alpha-training moves them (reported per cycle as the alpha_entropy metric)."""
    r = Runner(tiny_cfg)
    with torch.no_grad():
        for a in r.net.alpha_parameters():
            a.zero_()
    assert r.net.alpha_entropy() == pytest.approx(1.0)
    r.alpha_train()
    moved = r.net.alpha_entropy()
    assert 0.5 < moved < 1.0
    with torch.no_grad():
        for a in r.net.alpha_parameters():
            a.zero_()
            a[:, 0] = 50.0
    assert r.net.alpha_entropy() < 1e-3


def test_w_training_changes_only_weights(tiny_cfg):
    r = Runner(tiny_cfg)
    w0, a0 = _snapshot(r.net.weight_parameters()), _snapshot(r.net.alpha_parameters())
    r.w_train()
    assert not any(_changed(a0, r.net.alpha_parameters()))
    assert sum(_changed(w0, r.net.weight_parameters())) > len(w0) // 4


def test_phases_back_to_back_on_one_batch_never_backprop_twice(tiny_cfg):
    r = Runner(tiny_cfg)
    x, y = next(iter(Batches(r.data.train, 16)))
    r.net.train()
    for _ in range(2):
        r.weight_step(x, y, r.net.sample_plans(1.0, differentiable=False))
        r.alpha_step(x, y, 1.0)
    r.state.genotype = r.net.derive()
    r.weight_step(x, y, r.net.genotype_plans(r.state.genotype))
    r.alpha_step(x, y, 1.0)


def test_optimizers_live_for_the_whole_run_and_keep_momentum(tiny_cfg):
    r = Runner(tiny_cfg)
    wopt, aopt = r.weight_opt, r.alpha_opt
    r.w_train()
    stem_weight = r.net.stem[0].weight
    momentum = r.weight_opt.state[stem_weight]["momentum_buffer"].clone()
    r.alpha_train()
    r.mutate_phase()
    r.retrain("retrain", 1, r.data.train)
    assert r.weight_opt is wopt and r.alpha_opt is aopt
    assert not torch.equal(
        r.weight_opt.state[stem_weight]["momentum_buffer"], momentum
    )  # updated, not reset
    assert aopt.state[r.net.alphas["normal"]]["step"] >= 1
    # the optimizer holds every weight exactly once, and no alpha
    ids = [id(p) for g in wopt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(r.net.weight_parameters())


def test_derived_network_shares_the_supernets_weights(tiny_cfg):
    r = Runner(tiny_cfg)
    r.w_train()
    r.mutate_phase()
    view = DerivedNetwork(r.net, r.state.genotype)
    assert {id(p) for p in view.parameters()} == {id(p) for p in r.net.parameters()}
    used = list(r.net.derived_parameters(r.state.genotype))
    before = _snapshot(used)
    r.retrain("retrain", 1, r.data.train)
    assert any(_changed(before, used))  # retraining improved the supernet's own tensors


def test_derived_network_starts_from_the_supernets_training(tiny_cfg):
    cfg = tiny_cfg.replace(
        **{"search.w_epochs": 4, "data.train_subset": 0, "space.init_channels": 8}
    )
    trained = Runner(cfg)
    trained.w_train()
    genotype = trained._derive_calibrated()
    fresh = Runner(cfg)
    fresh.calibrate(genotype)
    inherited_acc = trained.evaluate(trained.data.val, genotype)[1]
    fresh_acc = fresh.evaluate(fresh.data.val, genotype)[1]
    assert inherited_acc > 0.2 and inherited_acc > fresh_acc + 0.05, (inherited_acc, fresh_acc)


def test_same_seed_same_run(tiny_cfg, tiny_run):
    results = []
    for res, rec in [(tiny_run.result, tiny_run.recorder), (None, Recorder())]:
        res = res or Runner(tiny_cfg, [rec]).run()
        results.append(
            (res.genotype, [(e.train_loss, e.val_acc) for e in rec.of("epoch_end")], res.test_acc)
        )
    assert results[0] == results[1]
    other = Runner(dataclasses.replace(tiny_cfg, seed=1)).run()
    assert other.test_acc != results[0][2] or other.genotype != results[0][0]


def test_channels_last_is_a_layout_not_a_method(tiny_cfg, digits):
    """speed.channels_last changes how the kernels run, not what the network computes:
    the same weights give the same logits in either layout (float tolerance)."""
    # 8 channels: on the CPU a narrower network keeps the plain layout (runner/device.py)
    wide = {"space.init_channels": 8}
    runs = {
        cl: Runner(tiny_cfg.replace(**{**wide, "speed.channels_last": cl}), data=digits)
        for cl in (False, True)
    }
    runs[True].net.load_state_dict(runs[False].net.state_dict())
    plans = runs[False].net.genotype_plans(runs[False].net.derive())
    x = digits.val.x[:32]
    logits = {}
    for cl, r in runs.items():
        r.net.eval()
        with torch.no_grad():
            logits[cl], layouts = cell_layouts(r.net, lambda r=r: r.net(x, plans))
        assert layouts == [cl] * len(r.net.cells)
    assert torch.allclose(logits[True], logits[False], atol=1e-5)


def test_drop_last_trains_every_step_on_a_whole_batch(tiny_cfg):
    """data.drop_last: every training step of every phase sees data.batch_size images (one
    shape for cuDNN's plans and CUDA graphs); without it, each epoch ends in a smaller one.
    Batch 40: the 128 search images and the validation split both end in 8 left over."""
    sizes = {}
    for drop in (False, True):
        cfg = tiny_cfg.replace(
            **{"data.batch_size": 40, "data.drop_last": drop, "search.cycles": 1}
        )
        runner = Runner(cfg)
        seen = sizes[drop] = set()
        runner.net.register_forward_pre_hook(
            lambda net, args, seen=seen: seen.add(len(args[0])) if torch.is_grad_enabled() else None
        )
        runner.run()
    assert (len(runner.data.train), len(runner.data.val) % 40) == (128, 8)
    assert sizes[False] == {40, 8} and sizes[True] == {40}


def test_a_checkpoint_from_before_the_speed_section_resumes_in_its_layout(tiny_cfg, tmp_path):
    """Runs saved before speed.channels_last existed trained in the default layout:
    resuming them keeps it, so they still repeat exactly."""
    from asolab.runner import checkpoint as ckpt

    cfg = tiny_cfg.replace(**{"speed.channels_last": False, "search.cycles": 1})
    Runner(cfg, checkpoint_dir=tmp_path).run()
    path = tmp_path / "checkpoint.pt"
    state = ckpt.load(path, "test")
    del state["config"]["speed"]
    state["format"] = 2  # as those versions wrote it: the tensors in place, not packed
    torch.save(state, path)
    resumed = Runner.resume(path)
    assert resumed.cfg.speed.channels_last is False
    fresh = Runner(tiny_cfg)
    assert fresh.cfg.speed.channels_last is True


def test_test_split_never_influences_the_search(tiny_cfg, tiny_run):
    data = load_data(tiny_cfg.data, tiny_cfg.seed)
    scrambled = dataclasses.replace(
        data, test=Split(torch.randn_like(data.test.x), torch.randint(0, 10, data.test.y.shape))
    )
    runs = [(tiny_run.result, [e.val_acc for e in tiny_run.recorder.of("epoch_end")])]
    rec = Recorder()
    res = Runner(tiny_cfg, [rec], data=scrambled).run()
    runs.append((res, [e.val_acc for e in rec.of("epoch_end")]))
    (a, va), (b, vb) = runs
    assert a.genotype == b.genotype and va == vb and a.val_acc == b.val_acc
    assert a.test_acc != b.test_acc


def test_events_cover_every_phase_and_cycle(tiny_run):
    rec = tiny_run.recorder
    epochs = rec.of("epoch_end")
    assert [e.phase for e in epochs] == ["w_train", "alpha", "retrain"] * 2
    assert [e.global_epoch for e in epochs] == list(range(6))
    cycles = rec.of("cycle_end")
    assert [c.cycle for c in cycles] == [0, 1]
    assert all(
        c.memory["rss_mb"] > 0 and c.memory["peak_rss_mb"] >= c.memory["rss_mb"] * 0.5
        for c in cycles
    )
    assert all(0 < c.derived_params < c.supernet_params for c in cycles)
    mutations = rec.of("mutation")
    assert len(mutations) == 2 and all(m.before != m.after and m.edits for m in mutations)
    end = rec.of("run_end")[0]
    assert end.genotype in {c.genotype for c in cycles} and 0 <= end.test_acc <= 1
    assert epochs[0].temperature > epochs[-1].temperature


def test_param_free_cap_holds_for_every_genotype_of_the_run(tiny_cfg):
    """Alphas pushed to pools and skips: uncapped the derived cells are all parameter-free;
    with search.param_free_cap = 1 every derived, mutated and final genotype keeps within it."""
    free = [tiny_cfg.space.primitives.index(p) for p in ("skip_connect", "avg_pool_3x3")]

    def run(cap):
        cfg = tiny_cfg.replace(**{"search.param_free_cap": cap, "mutation.strength": 1.0})
        rec = Recorder()
        runner = Runner(cfg, [rec])
        with torch.no_grad():
            for a in runner.net.alpha_parameters():
                a[:, free] = 20.0
        runner.run()
        return (
            [m.before for m in rec.of("mutation")]
            + [m.after for m in rec.of("mutation")]
            + [rec.of("run_end")[0].genotype]
        )

    assert max(g.most_param_free() for g in run(-1)) == 4
    assert max(g.most_param_free() for g in run(1)) == 1


@pytest.mark.parametrize("choice", ["best", "last", "derived"])
def test_final_genotype_follows_the_configured_choice(tiny_cfg, choice):
    cfg = dataclasses.replace(
        tiny_cfg, search=dataclasses.replace(tiny_cfg.search, cycles=3, final_genotype=choice)
    )
    rec = Recorder()
    runner = Runner(cfg, [rec])
    result = runner.run()
    cycles, end = rec.of("cycle_end"), rec.of("run_end")[0]
    accs = [c.val_acc for c in cycles]
    expected = {
        "best": cycles[max(range(len(accs)), key=lambda i: (accs[i], i))].genotype,
        "last": cycles[-1].genotype,
        # alphas do not move after the last mutation: derive() then is its unmutated input
        "derived": rec.of("mutation")[-1].before,
    }[choice]
    assert end.genotype == result.genotype == expected
    assert end.derived_params == runner.net.count_derived(expected)


def test_checkpoint_resume_continues_identically(tiny_run, tmp_path):
    full = tiny_run.result
    rec = Recorder()  # killed right after cycle 1's alpha phase was saved
    resumed = Runner.resume(tiny_run.checkpoint(1, "alpha", tmp_path), [rec]).run()
    assert rec.of("run_start")[0].resumed_from["cycle"] == 1
    assert [e.global_epoch for e in rec.of("epoch_end")] == [5]
    assert resumed.genotype == full.genotype and resumed.test_acc == full.test_acc


def test_fair_w_sampling_changes_the_run_and_resumes_identically(tiny_cfg, tiny_run, tmp_path):
    cfg = tiny_cfg.replace(**{"search.w_sampling": "fair"})
    # killed after cycle 0's W-training: rounds restart with each W-training phase, so
    # cycle 1's repeats the uninterrupted run's (a round carried over would not)
    rec = _Keeper(tmp_path / "run", 0, "w_train", tmp_path / "killed")
    full = Runner(cfg, [rec], checkpoint_dir=tmp_path / "run").run()
    gumbel = tiny_run.recorder
    w_losses = [e.train_loss for e in rec.of("epoch_end") if e.phase == "w_train"]
    assert w_losses != [e.train_loss for e in gumbel.of("epoch_end") if e.phase == "w_train"]
    resumed = Runner.resume(rec.checkpoint).run()
    assert resumed.genotype == full.genotype and resumed.test_acc == full.test_acc
    assert resumed.val_acc == full.val_acc


def test_every_phase_end_is_saved_and_cycle_ends_are_due(tiny_cfg, tmp_path):
    """Each phase end is saved locally; with search.checkpoint_minutes at its default only
    a cycle's end and the final stage's are due (uploaded at once); with 0, all are."""
    rec = Recorder()
    Runner(tiny_cfg.replace(**{"search.final_epochs": 2}), [rec], checkpoint_dir=tmp_path).run()
    saved = [(c.cycle, c.phase, c.due) for c in rec.of("checkpoint")]
    last = PHASES[-1].name
    assert saved == [
        *((c, p.name, p.name == last) for c in range(2) for p in PHASES),
        (2, "final", True),
    ]
    rec = Recorder()
    cfg = tiny_cfg.replace(**{"search.checkpoint_minutes": 0.0})
    Runner(cfg, [rec], checkpoint_dir=tmp_path / "every").run()
    assert all(c.due for c in rec.of("checkpoint")) and len(rec.of("checkpoint")) == 9


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    from asolab.runner.checkpoint import CheckpointError

    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        Runner.resume(bad)


def test_a_checkpoint_packs_its_tensors_and_reads_them_back_equal(tiny_run, tmp_path):
    """On disk the tensors are a few flat ones (one per dtype), not one pickle each; read
    back, every tensor equals the runner's, with its dtype and strides (channels-last
    weights included), and a packed tensor whose place runs past its group is corrupt."""
    from asolab.runner import checkpoint as ckpt

    tiny_run.checkpoint(1, "retrain", tmp_path)
    raw = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    flat = raw[ckpt.PACKED]["flat"]
    assert raw["format"] == ckpt.FORMAT and len(flat) <= 3  # float32, int64, uint8
    assert not any(isinstance(v, torch.Tensor) for v in raw["model"].values())
    runner = Runner.resume(tmp_path / "checkpoint.pt")
    state = ckpt.load(tmp_path / "checkpoint.pt")
    assert state.keys() == runner.checkpoint_state().keys() | {"format"}
    for name, value in runner.net.state_dict().items():
        assert torch.equal(state["model"][name], value), name
    opt = runner.weight_opt.state_dict()["state"]
    assert opt and all(
        torch.equal(state["weight_opt"]["state"][k]["momentum_buffer"], v["momentum_buffer"])
        for k, v in opt.items()
    )
    assert torch.equal(state["rng"]["torch"], torch.get_rng_state())  # as resume restored it

    w = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    odd = {"w": w, "views": [torch.arange(6)[::2], torch.ones(2, 1).expand(2, 3)], "n": 1.5}
    back = ckpt.unpack(ckpt.pack(odd))
    assert torch.equal(back["w"], w) and back["w"].stride() == w.stride()
    assert all(torch.equal(a, b) for a, b in zip(back["views"], odd["views"])) and back["n"] == 1.5

    raw[ckpt.PACKED]["flat"] = [f[:-1] for f in flat]  # one element short
    torch.save(raw, tmp_path / "short.pt")
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        ckpt.load(tmp_path / "short.pt")


class _Keeper(Recorder):
    """Keeps a copy of the checkpoint the run wrote in ``folder`` at (cycle, phase) (and
    final-stage epoch ``stage_epoch``) as ``into/checkpoint.pt``: the file a run killed
    right after it would leave behind, without training a second run up to there (the
    run is the same either way: the checkpoint is written before observers hear of it)."""

    def __init__(self, folder, cycle: int, phase: str, into, stage_epoch: int | None = None):
        super().__init__()
        self.folder, self.at, self.into = folder, (cycle, phase), into
        self.stage_epoch = stage_epoch

    def on_checkpoint(self, event):
        super().on_checkpoint(event)
        if (event.cycle, event.phase) == self.at and self.stage_epoch in (None, event.stage_epoch):
            self.into.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.folder / "checkpoint.pt", self.into / "checkpoint.pt")

    @property
    def checkpoint(self):
        return self.into / "checkpoint.pt"


def _growth_summary(events):
    return [
        (g.cycle, g.kind, g.where, g.params_before, g.params_after, g.preservation_error)
        for g in events
    ]


def test_checkpoints_name_the_cycle_their_phase_belonged_to(tiny_run):
    saved = [(c.cycle, c.phase) for c in tiny_run.recorder.of("checkpoint")]
    phases = ["w_train", "alpha", "mutate", "retrain"]
    assert saved == [(0, p) for p in phases] + [(1, p) for p in phases] + [(2, "final")]


def test_resume_after_mutate_still_reports_the_cycles_mutation_and_growth(tiny_cfg, tmp_path):
    """Killed during retraining: the cycle's end still carries its edits and growth."""
    cfg = tiny_cfg.replace(**{"growth.policy": "widen"})
    full = _Keeper(tmp_path / "run", 1, "mutate", tmp_path / "killed")
    Runner(cfg, [full], checkpoint_dir=tmp_path / "run").run()
    rec = Recorder()
    Runner.resume(full.checkpoint, [rec]).run()
    assert rec.of("run_start")[0].resumed_from["next"] == "retrain"
    assert (
        rec.of("mutation") == [] and rec.of("growth") == []
    )  # nothing of the mutation is replayed
    (end,) = rec.of("cycle_end")
    (ref,) = [c for c in full.of("cycle_end") if c.cycle == 1]
    assert end.mutation_edits == ref.mutation_edits == len(full.of("mutation")[1].edits) > 0
    assert end.growth and _growth_summary(end.growth) == _growth_summary(ref.growth)
    assert _growth_summary(ref.growth) == _growth_summary(
        [g for g in full.of("growth") if g.cycle == 1]
    )


def test_final_stage_is_checkpointed_and_resumes_without_training_again(tiny_final_run, tmp_path):
    full = tiny_final_run.result
    # killed during the final epochs: resume from the last cycle's checkpoint trains them again
    tiny_final_run.checkpoint(1, "retrain", tmp_path / "a")
    rec = Recorder()
    again = Runner.resume(
        tmp_path / "a" / "checkpoint.pt", [rec], checkpoint_dir=tmp_path / "a"
    ).run()
    assert rec.of("run_start")[0].resumed_from["next"] == "final"
    assert [e.phase for e in rec.of("epoch_end")] == ["final"]
    assert (again.genotype, again.test_acc) == (full.genotype, full.test_acc)
    assert [(c.cycle, c.phase) for c in rec.of("checkpoint")] == [(2, "final")]
    # killed during the evaluation: the final checkpoint holds the trained final network
    rec = Recorder()
    last = Runner.resume(tmp_path / "a" / "checkpoint.pt", [rec]).run()
    assert rec.of("run_start")[0].resumed_from["next"] == "evaluation"
    assert rec.of("epoch_end") == [] and rec.of("checkpoint") == []
    assert (last.genotype, last.test_acc, last.val_acc) == (
        full.genotype,
        full.test_acc,
        full.val_acc,
    )
    # the run's wall time carries over from the checkpoint (both earlier processes)
    saved = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)["seconds"]
    assert last.seconds > saved > again.seconds - saved > 0


def test_fresh_final_weights_retrain_the_genotype_from_scratch_and_resume(tiny_final_run, tmp_path):
    """search.final_weights = "fresh": the final network starts from new weights (its
    first epoch learns from chance level, not from what the search trained), alphas and
    genotype unchanged; killed before the final stage, the resume repeats the run."""
    cfg = tiny_final_run.cfg
    inherit = tiny_final_run.recorder
    kept = tiny_final_run.result
    fresh_cfg = cfg.replace(**{"search.final_weights": "fresh"})
    fresh = _Keeper(tmp_path / "run", 1, "retrain", tmp_path / "killed")  # before the final stage
    runner = Runner(fresh_cfg, [fresh], checkpoint_dir=tmp_path / "run")
    full = runner.run()
    assert full.genotype == kept.genotype and full.test_acc != kept.test_acc
    (first_inherited,) = [e for e in inherit.of("epoch_end") if e.phase == "final"]
    (first_fresh,) = [e for e in fresh.of("epoch_end") if e.phase == "final"]
    assert first_fresh.train_loss > first_inherited.train_loss
    # every weight is reached by a module's reset_parameters (none is left as trained)
    reset = {
        id(p)
        for m in runner.net.modules()
        if m is not runner.net and hasattr(m, "reset_parameters")
        for p in m.parameters(recurse=False)
    }
    assert all(id(p) in reset for p in runner.net.weight_parameters())
    again = Runner.resume(fresh.checkpoint).run()
    assert (again.genotype, again.test_acc, again.val_acc) == (
        full.genotype,
        full.test_acc,
        full.val_acc,
    )


def test_final_stage_checkpoints_between_epochs_and_resumes_inside_it(tiny_cfg, tmp_path):
    """A long final stage is checkpointed between its epochs (search.checkpoint_minutes):
    killed after its second epoch, the run resumes at the third and ends as if never stopped."""
    cfg = tiny_cfg.replace(**{"search.final_epochs": 4, "search.checkpoint_minutes": 0.0})
    killed = tmp_path / "killed"  # after the final stage's second epoch
    kept = _Keeper(tmp_path / "run", 2, "final", killed, stage_epoch=2)
    full = Runner(cfg, [kept], checkpoint_dir=tmp_path / "run").run()
    assert [c.stage_epoch for c in kept.of("checkpoint") if c.phase == "final"] == [1, 2, 3, 0]
    rec, screen = Recorder(), io.StringIO()
    resumed = Runner.resume(
        kept.checkpoint, [rec, ProgressObserver(screen)], checkpoint_dir=killed
    ).run()
    assert "(resumed in the final stage at epoch 3)" in screen.getvalue()
    bar = (
        screen.getvalue()
    )  # the bar counts the stage's earlier epochs: 2/4 when it appears, then 3/4, 4/4
    assert "| 3/4" in bar and "| 4/4" in bar and "| 0/4" not in bar and "| 1/4" not in bar
    start = rec.of("run_start")[0].resumed_from
    assert (start["next"], start["stage_epoch"]) == ("final", 2)
    assert [(e.phase, e.epoch) for e in rec.of("epoch_end")] == [("final", 2), ("final", 3)]
    # After epoch 3 a checkpoint inside the stage; after epoch 4 the stage's own (stage_epoch 0).
    assert [(c.phase, c.stage_epoch) for c in rec.of("checkpoint")] == [("final", 3), ("final", 0)]
    assert (resumed.genotype, resumed.test_acc, resumed.val_acc) == (
        full.genotype,
        full.test_acc,
        full.val_acc,
    )


def test_final_stage_checkpoints_only_when_the_last_one_is_old(tiny_cfg, tmp_path):
    """With the default interval a short final stage writes no checkpoints inside it."""
    rec = Recorder()
    cfg = tiny_cfg.replace(**{"search.final_epochs": 3, "search.checkpoint_minutes": 5.0})
    Runner(cfg, [rec], checkpoint_dir=tmp_path).run()
    assert [(c.phase, c.stage_epoch) for c in rec.of("checkpoint") if c.phase == "final"] == [
        ("final", 0)
    ]


def test_a_budget_fits_the_final_stage_to_the_minutes_left(tiny_cfg):
    """After the final stage's first epoch, search.budget_minutes fixes how many epochs
    like it fit in what is left, the evaluation's share kept back, within final_epochs."""
    cfg = tiny_cfg.replace(**{"search.final_epochs": 20, "search.budget_minutes": 10.0})
    rec = Recorder()
    r = Runner(cfg, [rec])
    images, evaluated = len(r.data.full_train), len(r.data.val) + len(r.data.test)
    assert 0 < evaluated / images < 1  # the reserve: under one epoch here
    r._elapsed, r._started = 100.0, time.perf_counter()  # 100 s of the 600 spent
    r._fit_final(100.0)  # 500 s left minus the reserve: the first epoch and 4 more
    assert r.final_epochs == r.state.final_epochs == 5
    plan = rec.of("final_plan")[0]
    assert (plan.epochs, plan.most, plan.budget_minutes, plan.seconds_per_epoch) == (5, 20, 10, 100)
    assert 400 / 60 < plan.minutes_left < 500 / 60
    # never more than final_epochs, never fewer than the one already trained
    r = Runner(cfg.replace(**{"search.final_epochs": 3}))
    r._elapsed, r._started = 100.0, time.perf_counter()
    r._fit_final(100.0)
    assert r.final_epochs == 3
    r = Runner(cfg)
    r._elapsed, r._started = 700.0, time.perf_counter()  # over the budget already
    r._fit_final(100.0)
    assert r.final_epochs == 1


def test_a_fitted_final_stage_is_stretched_over_the_same_schedule(tiny_cfg):
    """Fitted to fewer epochs than final_epochs, the final stage covers the same part of
    the cosine schedule: its epoch e runs at the learning rate of epoch e * F / N."""
    cfg = tiny_cfg.replace(**{"search.final_epochs": 6, "search.budget_minutes": 1.0})
    nominal, fitted = Runner(cfg), Runner(cfg)
    fitted.state.final_epochs = 2
    search = nominal.weight_epochs - 6
    for e in range(2):
        nominal.state.position.weight_epoch = search + 3 * e
        fitted.state.position.weight_epoch = search + e
        assert fitted.weight_lr() == pytest.approx(nominal.weight_lr())
    nominal.state.position.weight_epoch = fitted.state.position.weight_epoch = search
    assert fitted.weight_lr() == nominal.weight_lr()  # the search's schedule is the same
    fitted.state.position.weight_epoch = search + 2
    assert fitted.weight_lr() == pytest.approx(cfg.search.weight_lr_min)


def test_a_run_over_its_budget_trains_one_final_epoch_records_it_and_resumes(tiny_cfg, tmp_path):
    """A search that used the whole budget leaves the final stage one epoch; the count is
    announced (event, progress line), returned, and checkpointed: a run killed during its
    evaluation resumes there, its position checked against the fitted count."""
    cfg = tiny_cfg.replace(**{"search.final_epochs": 3, "search.budget_minutes": 0.0001})
    rec, screen = _Keeper(tmp_path / "run", 2, "final", tmp_path / "killed"), io.StringIO()
    full = Runner(cfg, [rec, ProgressObserver(screen)], checkpoint_dir=tmp_path / "run").run()
    assert [e.phase for e in rec.of("epoch_end")].count("final") == 1
    assert full.final_epochs == 1
    assert [(p.epochs, p.most) for p in rec.of("final_plan")] == [(1, 3)]
    assert "final stage: 1 of at most 3 epochs fit the 0.0001-minute budget" in screen.getvalue()

    killed, rec = rec.checkpoint, Recorder()
    last = Runner.resume(killed, [rec]).run()
    assert rec.of("run_start")[0].resumed_from["next"] == "evaluation"
    assert rec.of("run_start")[0].final_epochs == 1
    assert (last.genotype, last.test_acc, last.final_epochs) == (full.genotype, full.test_acc, 1)


def test_the_progress_bar_counts_the_first_epoch_and_shows_what_is_left(tiny_cfg):
    """A phase's bar appears after its first epoch: its time and what is left come from
    the epochs' seconds (tqdm's clock would miss that epoch), and follow a fitted stage."""
    from asolab.runner.events import EpochEnd, FinalPlan, RunStart

    cfg = tiny_cfg.replace(**{"search.final_epochs": 40, "search.budget_minutes": 57.0})
    screen = io.StringIO()
    bar = ProgressObserver(screen)
    bar.on_run_start(RunStart(cfg, {"name": "digits", "train": 1, "val": 1, "test": 1}, "cpu", {}))

    def epoch(e, seconds):
        return EpochEnd("final", 2, e, 6 + e, 1.0, 0.5, 1.0, 0.8, 0.5, {}, seconds, 248.0)

    bar.on_epoch_end(epoch(0, 223.0))
    assert "1/40, " in screen.getvalue() and "epoch=03:43, left=2:24:57" in screen.getvalue()
    bar.on_final_plan(FinalPlan(13, 40, 57.0, 223.0, 44.6))
    assert "1/13, " in screen.getvalue() and "left=44:36" in screen.getvalue()
    bar.on_epoch_end(epoch(1, 219.0))  # the mean of the two epochs, 221 s, times 11
    assert "2/13, val_acc=0.800" in screen.getvalue() and "left=40:31" in screen.getvalue()
    assert "2/13, val_acc=0.770" not in screen.getvalue()  # never the last epoch's figures
    assert "ep/s" not in screen.getvalue()


def test_progress_writes_to_stderr_as_it_is_when_the_bar_is_made(tiny_cfg, monkeypatch):
    """The default stream is the current sys.stderr: one bound at import time may have
    been replaced and closed since (a test's capture, a notebook), and writing to it failed
    when a resumed `asolab baseline` ran in the same process."""
    from asolab.runner.events import RunStart

    screen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", screen)
    bar = ProgressObserver()
    bar.on_run_start(
        RunStart(tiny_cfg, {"name": "digits", "train": 1, "val": 1, "test": 1}, "cpu", {})
    )
    assert "asolab: digits (1 train" in screen.getvalue()


def test_a_budget_that_fits_every_final_epoch_changes_nothing(tiny_cfg):
    cfg = tiny_cfg.replace(**{"search.final_epochs": 2})
    plain = Runner(cfg).run()
    rec = Recorder()
    budgeted = Runner(cfg.replace(**{"search.budget_minutes": 600.0}), [rec]).run()
    assert [(p.epochs, p.most) for p in rec.of("final_plan")] == [(2, 2)]
    assert (budgeted.genotype, budgeted.val_acc, budgeted.test_acc) == (
        plain.genotype,
        plain.val_acc,
        plain.test_acc,
    )


def _save_edited(src, dst, edit):
    from asolab.runner import checkpoint as ckpt

    state = ckpt.load(src)
    edit(state)
    ckpt.save(state, dst)
    return dst


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda s: s.pop("alpha_opt"), id="missing-key"),
        pytest.param(lambda s: s["model"].pop(next(iter(s["model"]))), id="weights-missing"),
        pytest.param(lambda s: s["spec"].update(num_classes=7), id="weights-of-another-spec"),
        pytest.param(lambda s: s["position"].update(step=3), id="unknown-position-field"),
    ],
)
def test_incomplete_or_mismatched_checkpoint_is_a_clear_error(tiny_run, tmp_path, edit):
    from asolab.runner.checkpoint import CheckpointError

    tiny_run.checkpoint(0, "alpha", tmp_path)  # a run killed after cycle 0's alpha phase
    Runner.resume(tmp_path / "checkpoint.pt")  # the untouched checkpoint restores
    bad = _save_edited(tmp_path / "checkpoint.pt", tmp_path / "bad.pt", edit)
    with pytest.raises(CheckpointError, match="incomplete or from another asolab version") as info:
        Runner.resume(bad)
    assert "\n" not in str(info.value) and str(bad) in str(info.value)


@pytest.mark.parametrize(
    "position",
    [
        pytest.param({"cycle": 99}, id="cycle-beyond-the-run"),
        pytest.param({"global_epoch": -5}, id="negative-epoch"),
        pytest.param({"phase": 7}, id="no-such-phase"),
        pytest.param({"global_epoch": 1}, id="epoch-of-another-position"),
        pytest.param({"stage_epoch": 1}, id="final-stage-epoch-inside-a-cycle"),
    ],
)
def test_checkpoint_at_a_position_its_run_never_reaches_is_refused(tiny_run, tmp_path, position):
    """Resuming there would skip or repeat epochs: the run would end with steps missing."""
    from asolab.runner.checkpoint import CheckpointError

    tiny_run.checkpoint(0, "alpha", tmp_path)  # a run killed after cycle 0's alpha phase
    Runner.resume(tmp_path / "checkpoint.pt")  # the untouched checkpoint restores
    edit = lambda s: s["position"].update(position)  # noqa: E731
    bad = _save_edited(tmp_path / "checkpoint.pt", tmp_path / "bad.pt", edit)
    with pytest.raises(CheckpointError, match="position its run cannot reach") as info:
        Runner.resume(bad)
    assert "\n" not in str(info.value) and str(bad) in str(info.value)


def test_every_checkpoint_of_a_run_is_at_a_position_it_reaches(tmp_path):
    """The position check accepts every checkpoint a real run writes (warm-up, final epochs)."""
    from asolab.runner.state import epochs_done

    class Check(Recorder):
        def on_checkpoint(self, event):
            super().on_checkpoint(event)
            p = runner.state.position
            assert epochs_done(p, runner.cfg.search) == (p.global_epoch, p.weight_epoch), event

    overrides = {
        **TINY,
        "search.cycles": 1,
        "search.warmup_epochs": 1,
        "search.final_epochs": 2,
        "search.checkpoint_minutes": 0,
    }
    check = Check()
    runner = Runner(config.load(None, overrides), [check], checkpoint_dir=tmp_path)
    runner.run()
    assert [e.phase for e in check.of("checkpoint")] == [
        *(p.name for p in PHASES),
        "final",
        "final",
    ]


def test_cuda_index_beyond_the_machines_devices_is_a_config_error():
    from asolab.config import ConfigError
    from asolab.runner.device import check_cuda_index

    check_cuda_index("cuda", 0)
    check_cuda_index("cuda:0", 1)
    check_cuda_index("cuda:1", 2)
    with pytest.raises(
        ConfigError, match=r"'cuda:1' but this machine has 1 CUDA device\(s\) \(cuda:0\)"
    ):
        check_cuda_index("cuda:1", 1)
    with pytest.raises(ConfigError, match=r"has 2 CUDA device\(s\) \(cuda:0 to cuda:1\)"):
        check_cuda_index("cuda:7", 2)
    with pytest.raises(ConfigError, match="not valid"):
        check_cuda_index("cuda:x", 2)


def test_an_observer_failing_on_the_start_still_sees_the_interruption(tiny_cfg):
    class FailOnStart(Recorder):
        def on_run_start(self, event):
            super().on_run_start(event)
            raise RuntimeError("store down")

    rec = FailOnStart()
    with pytest.raises(RuntimeError, match="store down"):
        Runner(tiny_cfg, [rec]).run()
    assert [k for k, _ in rec.events] == ["run_start", "run_interrupted"]


def test_a_diverging_loss_is_a_one_line_cli_error(capsys):
    from asolab.cli import main

    # lr 10 with weight decay 1 multiplies every weight by -9 per step: the loss overflows
    diverge = {
        "threads": 1,
        "space.init_channels": 4,
        "search.cycles": 1,
        "search.w_epochs": 1,
        "search.alpha_epochs": 0,
        "search.retrain_epochs": 0,
        "data.train_subset": 200,
        "data.batch_size": 8,
        "growth.policy": "none",
        "search.weight_lr": 10,
        "search.weight_lr_min": 10,
        "search.weight_decay": 1,
    }
    argv = ["run", "--quiet", "--no-track"] + [
        a for k, v in diverge.items() for a in ("--set", f"{k}={v}")
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and err.startswith("asolab: error:") and "loss became nan" in err
    )


def test_run_state_round_trips_through_plain_data(tiny_cfg):
    """What a checkpoint stores of RunState reads back equal, field by field."""
    from asolab.runner.events import GrowthEvent
    from asolab.runner.state import Position, RunState

    g = Runner(tiny_cfg).net.derive()
    event = GrowthEvent(
        cycle=1,
        kind="widen",
        where="cell 0",
        params_before=10,
        params_after=12,
        preservation_error=0.0,
        val_acc_before=0.5,
        val_acc_after=0.5,
        details={"spec": {}},
    )
    position = Position(cycle=1, phase=2, global_epoch=7, weight_epoch=5)
    state = RunState(position, g, None, [0.25, 0.5], [g, g], 3, [event])
    plain = state.to_dict()
    assert plain["derived"] == "" and plain["genotype"] == g.to_json()
    assert plain["position"]["global_epoch"] == 7
    assert RunState.from_dict(plain) == state
    assert RunState.from_dict(RunState().to_dict()) == RunState()


def test_same_seed_same_initial_weights_for_every_run_of_a_process(tiny_cfg):
    """The memory estimate before allocation draws no random numbers: the second run of
    a process (a study worker's next trial, a baseline arm) starts from the weights the
    first one did."""
    from asolab.runner import memory

    memory._op_elements.cache_clear()  # as in a fresh process
    first = Runner(tiny_cfg).net.state_dict()
    second = Runner(tiny_cfg).net.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
