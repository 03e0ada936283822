"""Gumbel-softmax sampling, temperature schedules and mutation."""

from __future__ import annotations

import pytest
import torch

from asolab.config import TemperatureConfig
from asolab.evolution.mutation import mutate, num_edits
from asolab.evolution.temperature import SCHEDULES, temperature
from asolab.space import PRIMITIVES, Genotype
from asolab.space.sampling import FairPaths, gumbel_softmax_st

CFG = TemperatureConfig(initial_temperature=5.0, min_temperature=0.5, anneal_fraction=0.8)


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s != "constant"])
def test_schedule_endpoints_and_monotonicity(schedule):
    cfg = TemperatureConfig(
        schedule=schedule, initial_temperature=5.0, min_temperature=0.5, anneal_fraction=0.8
    )
    assert temperature(0.0, cfg) == pytest.approx(5.0)
    assert temperature(0.8, cfg) == pytest.approx(0.5)
    assert temperature(1.0, cfg) == pytest.approx(0.5)
    values = [temperature(p / 100, cfg) for p in range(101)]
    assert all(b <= a + 1e-12 for a, b in zip(values, values[1:]))
    assert values[40] < 5.0 and values[40] > 0.5


def test_straight_through_sample_is_exactly_one_hot_and_passes_gradient():
    logits = torch.randn(5, 8, requires_grad=True)
    hard, index = gumbel_softmax_st(logits, 1.0)
    assert torch.equal(hard.detach(), torch.nn.functional.one_hot(index, 8).float())
    # the value multiplying the op output is 1, not softmax(one-hot) ~ 0.23
    assert hard[torch.arange(5), index].detach().eq(1.0).all()
    (hard[torch.arange(5), index] * torch.arange(5.0)).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_gumbel_noise_lives_on_the_alphas_device():
    # the meta device stands in for an accelerator: noise made on the CPU would fail or land there
    logits = torch.zeros(3, 4, device="meta")
    hard, index = gumbel_softmax_st(logits, 1.0)
    assert hard.device.type == "meta" and index.device.type == "meta"


def test_the_draw_is_the_alphas_softmax_at_any_temperature_which_shapes_the_gradient_only():
    """The Gumbel-max draw argmax(alphas + g) picks op o with probability softmax(alphas)_o
    whatever the temperature: from one noise, tau 0.1 and 100 draw the same ops, and the
    frequencies are the softmax's. The temperature enters the straight-through gradient
    alone (docs/concepts.md, "Temperature"): there a low tau gives its gradient to the
    drawn op and its nearest rival, a high one spreads it over every op."""
    logits = torch.tensor([0.0, 3.0, 0.0, 1.0]).repeat(20_000, 1)
    draws = {}
    for tau in (0.1, 100.0):
        torch.manual_seed(0)
        draws[tau] = gumbel_softmax_st(logits, tau)[1]
    assert torch.equal(draws[0.1], draws[100.0])
    frequency = torch.bincount(draws[0.1], minlength=4) / len(logits)
    assert torch.allclose(frequency, logits[0].softmax(-1), atol=0.01)

    carrying = {}  # ops whose alpha gets at least 1% of the largest gradient
    for tau in (0.1, 100.0):
        torch.manual_seed(0)
        alphas = torch.tensor([[0.0, 3.0, 0.0, 1.0]], requires_grad=True)
        hard, index = gumbel_softmax_st(alphas, tau)
        (hard * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
        g = alphas.grad[0].abs()
        carrying[tau] = int((g >= 0.01 * g.max()).sum())
    assert carrying[0.1] <= 2 < carrying[100.0] == 4


G = Genotype.parse(
    "normal: sep_conv_3x3(0) skip_connect(1) | dil_conv_3x3(0) sep_conv_3x3(2) -> 2,3 ; "
    "reduce: max_pool_3x3(0) max_pool_3x3(1) | skip_connect(2) max_pool_3x3(0) -> 2,3"
)


@pytest.mark.parametrize("strength, expected", [(0.0, 1), (0.25, 2), (0.5, 4), (1.0, 8)])
def test_mutation_makes_k_edits_never_to_the_same_op_or_none(strength, expected):
    assert num_edits(strength, G.num_edges) == expected
    torch.manual_seed(0)
    alphas = {k: torch.randn(5, len(PRIMITIVES)) for k in ("normal", "reduce")}
    after, edits = mutate(G, alphas, PRIMITIVES, strength, 1.0)
    assert len(edits) == expected
    assert len({(e.cell, e.node, e.input) for e in edits}) == expected
    for e in edits:
        assert e.after != e.before and e.after != "none"
    from asolab.space import distance

    assert distance(G, after) == expected


def test_mutation_never_takes_a_cell_past_the_param_free_cap():
    """Alphas that want a pool on every edge: uncapped, mutation fills the cells with
    parameter-free ops; with a cap it draws them only while a cell is below it."""
    pool = PRIMITIVES.index("avg_pool_3x3")
    alphas = {k: torch.zeros(5, len(PRIMITIVES)) for k in ("normal", "reduce")}
    for a in alphas.values():
        a[:, pool] = 8.0
    start = G.replace_op("reduce", 0, 0, "sep_conv_5x5").replace_op("reduce", 0, 1, "dil_conv_3x3")
    start = start.replace_op("reduce", 1, 2, "sep_conv_3x3")  # one pool left in each cell
    torch.manual_seed(0)
    uncapped = [mutate(start, alphas, PRIMITIVES, 1.0, 0.5)[0] for _ in range(20)]
    assert max(g.most_param_free() for g in uncapped) >= 3
    for cap in (0, 1, 2):
        for _ in range(20):
            after, edits = mutate(start, alphas, PRIMITIVES, 1.0, 0.5, cap)
            assert after.most_param_free() <= max(cap, 1) and len(edits) == 8
        if cap == 0:  # the pool already there is swapped away, none comes in
            assert after.most_param_free() == 0


def test_fair_paths_train_every_op_once_per_round_on_every_edge():
    torch.manual_seed(0)
    trainable = [i for i, p in enumerate(PRIMITIVES) if p != "none"]
    paths = FairPaths(trainable)
    k = len(trainable)
    for _ in range(3):  # three rounds
        rounds = [paths.draw(key, 5) for key in ("normal", "reduce") for _ in range(k)]
        for key_draws in (rounds[:k], rounds[k:]):
            for edge in range(5):
                assert sorted(d[edge] for d in key_draws) == trainable
    # the order is random, not the same on every edge
    assert len({tuple(d[e] for d in rounds[:k]) for e in range(5)}) > 1


def test_fair_plans_cover_every_alpha_matrix_and_never_run_none():
    from asolab.config import SpaceConfig
    from asolab.space.network import SearchNetwork
    from asolab.space.spec import ArchSpec

    net = SearchNetwork(ArchSpec.from_config(SpaceConfig(init_channels=4), 1, 10))
    paths = FairPaths(net.trainable_ops())
    none = PRIMITIVES.index("none")
    seen = {kind: set() for kind in net.alphas}
    for _ in range(len(net.trainable_ops())):
        plans = net.fair_plans(paths)
        assert set(plans) == set(net.alphas)
        for kind, plan in plans.items():
            assert len(plan) == net.spec.num_edges and all(len(c) == 1 for c in plan)
            seen[kind] |= {(e, c[0][0]) for e, c in enumerate(plan)}
            assert all(c[0][0] != none for c in plan)
    assert all(len(s) == net.spec.num_edges * len(net.trainable_ops()) for s in seen.values())
    net(torch.randn(2, 1, 8, 8), plans)  # the plans run
