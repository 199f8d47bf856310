"""Rank grid against a brute-force enumeration, and equivalence classes on small clusters."""
import itertools

from simtrain.hardware.topology import load_topology
from simtrain.plan.grid import RankGrid, equivalence_classes


def test_grid_matches_brute_force_order():
    tp, cp, dp, pp = 2, 1, 3, 2
    g = RankGrid(tp, cp, dp, pp)
    # tp-cp-ep-dp-pp, first fastest: enumerate with pp outermost
    expect = [dict(stage=s, dp_rank=d, cp_rank=c, tp_rank=t)
              for s, d, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp))]
    dense = ("stage", "dp_rank", "cp_rank", "tp_rank")
    assert [{k: g.coords(r)[k] for k in dense} for r in range(g.world)] == expect
    assert g.groups("tp")[0] == (0, 1)
    assert g.groups("dp")[0] == (0, 2, 4)
    assert g.groups("pp")[0] == (0, 6)
    # worked example of the module docstring
    g2 = RankGrid(2, 1, 2, 2)
    assert {k: g2.coords(5)[k] for k in dense} == {"tp_rank": 1, "cp_rank": 0, "dp_rank": 0, "stage": 1}


def test_symmetric_plan_has_one_class_per_stage(plain_topology):
    topo = load_topology(plain_topology, nodes=4)
    classes = equivalence_classes(RankGrid(4, 1, 2, 2), topo)
    assert [c.stage for c in classes] == [0, 1]
    assert [c.multiplicity for c in classes] == [8, 8]


def test_asymmetric_placement_splits_classes(plain_topology):
    # tp 2 on 4-device nodes, dp 3 x pp 2 = 12 ranks on 3 nodes: dp groups stay in nodes for some
    # stages and cross them for others, so shapes differ and classes split; every rank is in one class
    topo = load_topology(plain_topology, nodes=3)
    classes = equivalence_classes(RankGrid(2, 1, 3, 2), topo)
    ranks = sorted(r for c in classes for r in c.ranks)
    assert ranks == list(range(12))
    assert len(classes) > 2
