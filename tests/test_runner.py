"""The ASO-SE cycle: phase semantics, optimizer lifetime, reproducibility, and the
failure modes of earlier ASO-SE implementations as regression tests."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from asolab.data import Batches, Split, load_data
from asolab.runner import Runner
from asolab.runner.events import Recorder
from asolab.space.network import DerivedNetwork


def _snapshot(params):
    return [p.detach().clone() for p in params]


def _changed(before, params):
    return [not torch.equal(b, p.detach()) for b, p in zip(before, params)]


def test_alpha_training_changes_only_alphas(tiny_cfg):
    r = Runner(tiny_cfg)
    w0, a0 = _snapshot(r.net.weight_parameters()), _snapshot(r.net.alpha_parameters())
    r._alpha_train()
    assert not any(_changed(w0, r.net.weight_parameters()))
    assert all(_changed(a0, r.net.alpha_parameters()))
    assert all(p.requires_grad for p in r.net.weight_parameters())  # unfrozen afterwards


def test_w_training_changes_only_weights(tiny_cfg):
    r = Runner(tiny_cfg)
    w0, a0 = _snapshot(r.net.weight_parameters()), _snapshot(r.net.alpha_parameters())
    r._w_train()
    assert not any(_changed(a0, r.net.alpha_parameters()))
    assert sum(_changed(w0, r.net.weight_parameters())) > len(w0) // 4


def test_phases_back_to_back_on_one_batch_never_backprop_twice(tiny_cfg):
    r = Runner(tiny_cfg)
    x, y = next(iter(Batches(r.data.train, 16)))
    r.net.train()
    for _ in range(2):
        r._weight_step(x, y, r.net.sample_plans(1.0, differentiable=False))
        r._alpha_step(x, y, 1.0)
    r.genotype = r.net.derive()
    r._weight_step(x, y, r.net.genotype_plans(r.genotype))
    r._alpha_step(x, y, 1.0)


def test_optimizers_live_for_the_whole_run_and_keep_momentum(tiny_cfg):
    r = Runner(tiny_cfg)
    wopt, aopt = r.weight_opt, r.alpha_opt
    r._w_train()
    stem_weight = r.net.stem[0].weight
    momentum = r.weight_opt.state[stem_weight]["momentum_buffer"].clone()
    r._alpha_train()
    r._mutate()
    r._retrain("retrain", 1, r.data.train)
    assert r.weight_opt is wopt and r.alpha_opt is aopt
    assert not torch.equal(r.weight_opt.state[stem_weight]["momentum_buffer"], momentum)  # updated, not reset
    assert aopt.state[r.net.alphas["normal"]]["step"] >= 1
    # the optimizer holds every weight exactly once, and no alpha
    ids = [id(p) for g in wopt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(r.net.weight_parameters())


def test_derived_network_shares_the_supernets_weights(tiny_cfg):
    r = Runner(tiny_cfg)
    r._w_train()
    r._mutate()
    view = DerivedNetwork(r.net, r.genotype)
    assert {id(p) for p in view.parameters()} == {id(p) for p in r.net.parameters()}
    used = list(r.net.derived_parameters(r.genotype))
    before = _snapshot(used)
    r._retrain("retrain", 1, r.data.train)
    assert any(_changed(before, used))  # retraining improved the supernet's own tensors


def test_derived_network_starts_from_the_supernets_training(tiny_cfg):
    cfg = tiny_cfg.replace(**{"search.w_epochs": 4, "data.train_subset": 0, "space.init_channels": 8})
    trained = Runner(cfg)
    trained._w_train()
    genotype = trained._derive_calibrated()
    fresh = Runner(cfg)
    fresh._calibrate(genotype)
    inherited_acc = trained.evaluate(trained.data.val, genotype)[1]
    fresh_acc = fresh.evaluate(fresh.data.val, genotype)[1]
    assert inherited_acc > 0.2 and inherited_acc > fresh_acc + 0.05, (inherited_acc, fresh_acc)


def test_same_seed_same_run(tiny_cfg):
    results = []
    for _ in range(2):
        rec = Recorder()
        res = Runner(tiny_cfg, [rec]).run()
        results.append((res.genotype, [(e.train_loss, e.val_acc) for e in rec.of("epoch_end")], res.test_acc))
    assert results[0] == results[1]
    other = Runner(dataclasses.replace(tiny_cfg, seed=1)).run()
    assert other.test_acc != results[0][2] or other.genotype != results[0][0]


def test_test_split_never_influences_the_search(tiny_cfg):
    data = load_data(tiny_cfg.data, tiny_cfg.seed)
    scrambled = dataclasses.replace(data, test=Split(torch.randn_like(data.test.x), torch.randint(0, 10, data.test.y.shape)))
    runs = []
    for bundle in (data, scrambled):
        rec = Recorder()
        res = Runner(tiny_cfg, [rec], data=bundle).run()
        runs.append((res, [e.val_acc for e in rec.of("epoch_end")]))
    (a, va), (b, vb) = runs
    assert a.genotype == b.genotype and va == vb and a.val_acc == b.val_acc
    assert a.test_acc != b.test_acc


def test_events_cover_every_phase_and_cycle(tiny_cfg):
    rec = Recorder()
    Runner(tiny_cfg, [rec]).run()
    epochs = rec.of("epoch_end")
    assert [e.phase for e in epochs] == ["w_train", "alpha", "retrain"] * 2
    assert [e.global_epoch for e in epochs] == list(range(6))
    cycles = rec.of("cycle_end")
    assert [c.cycle for c in cycles] == [0, 1]
    assert all(c.memory["rss_mb"] > 0 and c.memory["peak_rss_mb"] >= c.memory["rss_mb"] * 0.5 for c in cycles)
    assert all(0 < c.derived_params < c.supernet_params for c in cycles)
    mutations = rec.of("mutation")
    assert len(mutations) == 2 and all(m.before != m.after and m.edits for m in mutations)
    end = rec.of("run_end")[0]
    assert end.genotype in {c.genotype for c in cycles} and 0 <= end.test_acc <= 1
    assert epochs[0].temperature > epochs[-1].temperature


@pytest.mark.parametrize("choice", ["best", "last", "derived"])
def test_final_genotype_follows_the_configured_choice(tiny_cfg, choice):
    cfg = dataclasses.replace(tiny_cfg, search=dataclasses.replace(tiny_cfg.search, cycles=3, final_genotype=choice))
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


def test_checkpoint_resume_continues_identically(tiny_cfg, tmp_path):
    full = Runner(tiny_cfg).run()

    class StopAfter(Exception):
        pass

    class Stopper(Recorder):
        def on_checkpoint(self, event):
            if event.cycle == 1 and event.phase == "alpha":
                raise StopAfter

    with pytest.raises(StopAfter):
        Runner(tiny_cfg, [Stopper()], checkpoint_dir=tmp_path).run()
    rec = Recorder()
    resumed = Runner.resume(tmp_path / "checkpoint.pt", [rec]).run()
    assert rec.of("run_start")[0].resumed_from["cycle"] == 1
    assert [e.global_epoch for e in rec.of("epoch_end")] == [5]
    assert resumed.genotype == full.genotype and resumed.test_acc == full.test_acc


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    from asolab.runner.checkpoint import CheckpointError

    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        Runner.resume(bad)
