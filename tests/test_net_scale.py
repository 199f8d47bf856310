"""Collective latency at scale: NCCL's per-step latency over rings of thousands of ranks and trees
over hundreds of nodes, in the simulated time (not only in the algorithm choice).

Hand derivations use NCCL's tuning constants as the shared data gives them:
shared/data/calibration/nccl-algorithms/nccl-tuning-constants-2.18-2.23.yaml, lines 19-22
(baseLat: Ring LL 6.6 / LL128 14.0 / Simple 8.4 us, Tree 6.8 / 14.0 / 8.4 us in 2.23), lines 37-40
(hwLat 2.23: NVLINK Ring .6 / 1.9 / 3.4, Tree .6 / 1.25 / 4.0; NET Ring 2.7 / 4.0 / 14.0, Tree
5.0 / 8.5 / 14), lines 68-74 (latency_model: ring base + (nsteps - nInter) x max(intraLat,
netOverhead) + nInter x interLat, netOverhead 1 us x 3 for Simple across nodes, nInter 2(nNodes-1)
for an all-reduce in 2.23; tree base + 2((ppn-1) intraLat + log2 nNodes x interLat); the x1.4
plateau of a multi-node Ring/Simple all-reduce once nBytes / (nChannels x nRanks) >= 64).
The fabric is the tests' plain one: 4 devices per node, NIC 10 GB/s, spine oversubscription 2."""
import pytest

from simtrain.hardware.topology import load_topology
from simtrain.network import nccl_tuning
from simtrain.network.collectives import choose, cost
from simtrain.plan.grid import GroupShape

US = 1e-6


def shape(ranks, per_node):
    nodes = ranks // per_node
    return GroupShape(size=ranks, nodes=nodes, per_node=per_node, uniform=True, leaves=max(1, nodes // 2),
                      min_per_node=per_node, span="spine")


@pytest.fixture
def big(plain_topology):
    return load_topology(plain_topology, nodes=1536)


def test_ring_all_reduce_over_1536_ranks_one_per_node_pays_every_network_step(big):
    # data-parallel all-reduce over 1,536 ranks, one per node (tp 8 would fill the node):
    # 2 x 1535 = 3,070 ring steps, every one across the network at 14 us (Ring/Simple)
    g = shape(1536, 1)
    small = cost("all_reduce", 1e6, g, big, "ring", "Simple")
    # 1e6 B / (16 channels x 1536 ranks) = 40.7 B < 64: no plateau factor
    assert small.latency == pytest.approx((8.4 + 3070 * 14.0) * US, rel=1e-12)
    large = cost("all_reduce", 1e8, g, big, "ring", "Simple")
    # 1e8 / (16 x 1536) = 4069 B >= 64: x1.4
    assert large.latency == pytest.approx((8.4 + 3070 * 14.0) * 1.4 * US, rel=1e-12)
    assert large.latency == pytest.approx(60.18376e-3, rel=1e-9)
    # reduce-scatter: 1535 steps
    rs = cost("reduce_scatter", 1e8, g, big, "ring", "Simple")
    assert rs.latency == pytest.approx((8.4 + 1535 * 14.0) * US, rel=1e-12)


@pytest.mark.parametrize("proto,lat_us", [
    # 1536 ranks on 384 nodes of 4: 3,070 steps, 2 x 383 = 766 across the network, 2,304 inside
    ("LL", 6.6 + 2304 * 0.6 + 766 * 2.7),      # intra step 0.6 (netOverhead off in the simulated time)
    ("LL128", 14.0 + 2304 * 1.9 + 766 * 4.0),  # max(1.9, 1.0)
    ("Simple", 8.4 + 2304 * 3.4 + 766 * 14.0),  # max(3.4, 3.0); 1e5 B is below the x1.4 plateau
])
def test_ring_latency_intra_and_inter_steps_per_protocol(big, proto, lat_us):
    g = shape(1536, 4)
    c = cost("all_reduce", 1e5, g, big, "ring", proto)
    assert c.latency == pytest.approx(lat_us * US, rel=1e-12)
    # the same latency as NCCL 2.23's own tuner computes for this communicator, where its
    # netOverhead floor does not bind (LL128, Simple)
    if proto != "LL":
        x = nccl_tuning.Inputs(nodes=384, ranks=1536)
        assert c.latency == pytest.approx(nccl_tuning.latency("2.23", "all_reduce", "Ring", proto, x) * US, rel=1e-12)


def test_ring_inside_one_node_pays_no_network_overhead(plain_topology):
    topo = load_topology(plain_topology, nodes=1)
    g = GroupShape(size=4, nodes=1, per_node=4, uniform=True, leaves=1)
    # LL: 6.6 + 6 x 0.6
    assert cost("all_reduce", 1e5, g, topo, "ring", "LL").latency == pytest.approx((6.6 + 6 * 0.6) * US, rel=1e-12)


@pytest.mark.parametrize("nodes", [2, 16, 256])
@pytest.mark.parametrize("proto,base,intra,inter", [("LL", 6.8, 0.6, 5.0), ("LL128", 14.0, 1.25, 8.5),
                                                     ("Simple", 8.4, 4.0, 14.0)])
def test_tree_latency_grows_with_depth(big, nodes, proto, base, intra, inter):
    # 4 ranks per node: 2((4-1) chain steps + log2 N tree levels); 256 nodes: 8 levels
    g = shape(4 * nodes, 4)
    depth = nodes.bit_length() - 1
    c = cost("all_reduce", 1e5, g, big, "tree", proto)
    assert c.latency == pytest.approx((base + 2 * (3 * intra + depth * inter)) * US, rel=1e-12)
    x = nccl_tuning.Inputs(nodes=nodes, ranks=4 * nodes)
    assert c.latency == pytest.approx(nccl_tuning.latency("2.23", "all_reduce", "Tree", proto, x) * US, rel=1e-12)


def test_nccl_choice_at_1536_ranks_times_its_pick_with_the_scaled_latency(big):
    # under NCCL 2.23's tuner a 1 MB all-reduce over 1,536 ranks (384 nodes of 4) is far from a
    # ring: the ring's 4.4-16 ms latency loses to the tree's 100.4 us (LL); the simulated time is
    # the pick's latency plus its transfer
    g = shape(1536, 4)
    c = choose("all_reduce", 1e6, g, big, nccl=nccl_tuning.Policy("2.23"))
    assert c.algorithm == "tree"
    assert c.latency == pytest.approx(cost("all_reduce", 1e6, g, big, c.algorithm, c.protocol).latency, rel=1e-12)
    # pinned to Ring/Simple, the simulated time carries the 3,070-step latency
    ring = choose("all_reduce", 1e8, g, big, nccl=nccl_tuning.Policy("2.23", ("Ring",), ("Simple",)))
    assert ring.algorithm == "ring"
    assert ring.latency == pytest.approx((8.4 + 2304 * 3.4 + 766 * 14.0) * 1.4 * US, rel=1e-12)
