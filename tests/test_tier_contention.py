"""Concurrent data-parallel collectives of different pipeline stages on an oversubscribed tier,
in the analytical backend: each ring that leaves its leaf carries its stage's load on the leaf
uplinks, and the engine shares them among the ops that overlap."""
import pytest
from conftest import ROOT

from simtrain.hardware.topology import load_topology
from simtrain.network.analytical import ring_flows
from simtrain.plan.grid import RankGrid, placement
from simtrain.simulate import simulate
from simtrain.spec.loading import load_scenario

PLACEMENT = ROOT / "scenarios" / "llama3-70b-a100-1024-placement.yaml"
TWO_STAGES = ["network.backend=analytical", "parallel.pp=2", "parallel.dp=64"]


def test_tier_loads_of_one_stage_by_hand():
    """dgx-a100-2to1 at 128 nodes: 16-node leaves, a leaf's uplinks 8 x 200 GB/s = 1.6 TB/s
    (see `tier_bandwidth`). tp 8 x pp 2 x dp 64: a stage's 8 dp rings have one member per node
    over 64 nodes. Scattered (node k on leaf k mod 8), every hop leaves its leaf: per leaf
    8 nodes x 8 rings = 64 flows out and 64 in, at the NIC's 25 GB/s (64 x 25 GB/s fits
    1.6 TB/s exactly), so 64 x 25 / 1,600 = 1.0 of every leaf's uplinks each way. Megatron order:
    stage 0 fills leaves 0-3, each ring leaves each of them once (15->16, 31->32, 47->48,
    63->0): 8 flows, 8 x 25 / 1,600 = 0.125, on those four leaves only."""
    topo = load_topology(ROOT / "topologies" / "dgx-a100-2to1.yaml", 128)
    g = RankGrid(8, 1, 64, 2)
    for policy, want, leaves in (("scattered", 1.0, range(8)), ("megatron", 0.125, range(4))):
        src, dst = ring_flows(g, "dp", placement(g, topo, policy), topo)[0]
        bw = topo.tier_bandwidth(src, dst)
        assert bw == pytest.approx(25e9, rel=1e-12)
        loads = dict(topo.tier_loads(src, dst, bw))
        assert set(loads) == {("leaf", way, i) for way in ("up", "down") for i in leaves}
        assert all(u == pytest.approx(want, rel=1e-12) for u in loads.values())
    nonblocking = load_topology(ROOT / "topologies" / "dgx-a100.yaml", 128)
    assert nonblocking.tier_loads(src, dst, 25e9) == ()


def _param_gathers(policy):
    sc, topo = load_scenario(PLACEMENT, TWO_STAGES + [f"parallel.placement={policy}"])
    s = simulate(sc, topo)
    ops = [o for o in s.ops if o.kind == "coll" and o.label == "all_gather:param_all_gather"]
    assert len(ops) == 2 and {o.cls for o in ops} == {c.id for c in s.classes}   # one class per stage
    return [(o, s.timeline.start[o.id], s.timeline.end[o.id]) for o in ops]


def test_two_stages_param_gathers_share_the_leaf_uplinks():
    """Scattered on the 2:1 fabric, each stage's param all-gather alone uses u = 1.0 x its
    transfer share of every leaf's uplinks (above; u just under 1, the rest is latency). Both
    start together after the global grad-norm all-reduce, so the engine's max-min sharing
    (`FluidNetwork`) runs both at rate 1 / (ua + ub) on the shared leaves: each takes ua + ub
    times its time alone. In Megatron order the stages use 0.125u of disjoint leaves and
    nothing slows."""
    (a, sa, ea), (b, sb, eb) = _param_gathers("scattered")
    assert sa == pytest.approx(sb, abs=1e-8)        # the stages' optimizer steps differ by ns
    la, lb = dict(a.load), dict(b.load)
    assert set(la) == set(lb) and len(la) == 16
    ua, ub = max(la.values()), max(lb.values())     # the last stage gathers its LM head too
    for u, loads in ((ua, la), (ub, lb)):
        assert 0.95 < u <= 1.0 and all(x == pytest.approx(u, rel=1e-12) for x in loads.values())
    # equal rates 1 / (ua + ub) while both run; the two durations differ by 2e-6 relative
    assert ea - sa == pytest.approx(a.duration * (ua + ub), rel=1e-5)
    assert eb - sb == pytest.approx(b.duration * (ua + ub), rel=1e-5)
    for o, s, e in _param_gathers("megatron"):
        assert max(dict(o.load).values()) == pytest.approx(0.125 * ua, rel=1e-5)
        assert e - s == pytest.approx(o.duration, rel=1e-12)


def test_no_tier_load_on_a_nonblocking_fabric():
    """dgx-a100 has no oversubscribed tier: the analytical backend's ops share nothing."""
    sc, topo = load_scenario(PLACEMENT, TWO_STAGES + ["parallel.placement=scattered", "cluster.topology=dgx-a100"])
    s = simulate(sc, topo)
    assert not any(o.load for o in s.ops)


def test_pipeline_sends_across_the_tier_by_hand():
    """dgx-a100-2to1 at 32 nodes (two 16-node leaves), tp 8 x pp 4 x dp 8 in Megatron order:
    stage s holds nodes 8s..8s+7, so stages 0-1 sit on leaf 0 and 2-3 on leaf 1. Stage 1's 64
    ranks send to stage 2 at once across the spine: 64 flows out of leaf 0, 64 x 25 GB/s =
    1.6 TB/s, the leaf's uplinks exactly, so each send runs at its NIC's 25 GB/s (the full-load
    link class says 12.5) and uses 1.0 x its transfer share of leaf 0's uplinks out and leaf 1's
    in. A send within a leaf (stage 0 to 1) keeps the link class and carries no load."""
    sc, topo = load_scenario(PLACEMENT, ["network.backend=analytical", "parallel.pp=4", "parallel.dp=8",
                                         "cluster.nodes=32", "training.global_batch_size=64"])
    s = simulate(sc, topo)
    stage = {c.id: c.stage for c in s.classes}
    spine = topo._link_by_class("spine")
    for o in (o for o in s.ops if o.kind == "send"):
        if stage[o.cls] == 1 and o.label.startswith("send_act"):       # stage 1 -> 2, forward
            transfer = o.bytes / (25e9 * spine.efficiency)
            assert o.duration == pytest.approx(spine.latency + transfer, rel=1e-12)
            share = transfer / o.duration * sum(c.multiplicity for c in s.classes if c.id == o.cls) / 64
            assert dict(o.load) == pytest.approx({("leaf", "up", 0): share, ("leaf", "down", 1): share}, rel=1e-12)
        elif stage[o.cls] == 0:                                        # stage 0 -> 1 inside leaf 0
            assert not o.load and o.duration == pytest.approx(topo.link(0, 8 * 8).latency + o.bytes / (
                topo.link(0, 8 * 8).bw * topo.link(0, 8 * 8).efficiency), rel=1e-12)
